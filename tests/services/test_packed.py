"""The packed publish form and the compact answer, unit by unit: which path a packed request takes,
that the lean paths publish exactly what the per-record path would (same places, same bodies, same
refusals with the same messages), and that the SDK's packing and unfolding match the messages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.client import OutgoingRecord, PublishResult, PublishResults
from broker.client import wire as client_wire
from broker.client.errors import BrokerError, InvalidArgument
from broker.clock import ManualClock
from broker.core import errors
from broker.core.applied import Appended
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, Published, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.services import packed, wire
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, internal_pb2

pytestmark = pytest.mark.unit
R = broker_pb2.PublishRecord


def request(*records: R, **fields: object) -> broker_pb2.PublishRequest:
    return broker_pb2.PublishRequest(topic="t", packed_records=[r.SerializeToString() for r in records],
                                     **fields)  # type: ignore[arg-type]


def test_plain_keyed_and_other_records_take_their_path() -> None:
    plain = packed.packed_batch(request(R(value=b"a"), R(value=b"b", op="OP_DELETE"), R()))
    assert plain.bodies is not None and plain.keys is None and not plain.records
    assert plain.bodies == [R(value=b"a").SerializeToString(), R(value=b"b", op="OP_DELETE").SerializeToString(), b""]
    assert list(plain.record_values()) == [b"a", b"b", b""]
    keyed = packed.packed_batch(request(R(value=b"a", key=b"k"), R(value=b"b"), R(value=b"c", key=b"")))
    assert keyed.keys == [b"k", None, b""] and keyed.bodies is not None
    assert list(keyed.record_values()) == [b"a", b"b", b"c"]
    all_keyed = packed.packed_batch(request(R(value=b"x" * 300, key=b"k1"), R(key=b""), R(value=b"yz", key=b"k3")))
    assert all_keyed.keys == [b"k1", b"", b"k3"] and list(all_keyed.record_values()) == [b"x" * 300, b"", b"yz"]
    for slow in (R(value=b"a", partition=0), R(value=b"a", headers={"h": "1"}), R(value=b"a", idempotency_key="i"),
                 R(value=b"a", msg_id=3)):
        batch = packed.packed_batch(request(R(value=b"x"), slow))
        assert batch.bodies is None and len(batch.records) == 2, slow


@pytest.mark.parametrize("forged", [b"\x42\x01m", b"\x52\x01o", b"\x5a\x011", b"\xf8\x07\x01", b"\x48\x07",
                                    b"\x48\xff\xff\xff\xff\x0f", b"\x4a\x01\x01", b"\x2d\x00\x00\x00\x00"])
def test_a_field_a_stored_body_may_not_carry_never_passes_the_lean_path(forged: bytes) -> None:
    """producer (8), origin (10), msg_id (11), an unknown field (127), an op outside the enum (7,
    -1), op as a length-delimited field, value as a fixed32."""
    for record in (R(value=b"v"), R(value=b"v", key=b"k")):
        batch = packed.packed_batch(request(R(value=b"ok"), R.FromString(record.SerializeToString() + forged)))
        assert batch.bodies is None, "the per-record path"
        body = internal_pb2.RecordBody.FromString(batch.records[1].body)
        assert not body.producer and not body.origin and not body.msg_id


def test_repeated_allowed_fields_pass_the_lean_path_and_read_as_the_per_record_path_would() -> None:
    """A record may repeat value, key or op (the last one counts, for the check and for every
    reader); the keys still come out one per record, in order."""
    twice_key = R(key=b"k0", value=b"a").SerializeToString() + R(key=b"k1").SerializeToString()
    twice_op = R(value=b"b", op="OP_DELETE").SerializeToString() + R(op="OP_UPDATE").SerializeToString()
    batch = packed.packed_batch(broker_pb2.PublishRequest(topic="t", packed_records=[twice_key, R().SerializeToString(),
                                                                                     twice_op]))
    assert batch.bodies is not None and batch.keys == [b"k1", None, None]
    slow = packed.packed_batch(broker_pb2.PublishRequest(topic="t", packed_records=[twice_key, b"\x10\x01", twice_op]))
    assert slow.bodies is None, "a partition (field 2) takes the per-record path"
    for i in (0, 2):
        assert internal_pb2.RecordBody.FromString(batch.bodies[i]) == internal_pb2.RecordBody.FromString(
            slow.records[i].body)


@pytest.mark.parametrize("record", [b"\x2a\x05ab", b"\x48\x80", b"\x2a", b"\x0c", b"\x2a\x01a\x4c"],
                         ids=["value-past-its-end", "cut-varint", "cut-length", "stray-end-group", "end-group-late"])
def test_a_record_that_is_not_its_own_message_never_passes_the_lean_path(record: bytes) -> None:
    """Joined with the next record, a field that runs past its record's end would read as fine:
    each record must parse on its own."""
    with pytest.raises(errors.InvalidArgument, match="packed record 0"):
        packed.packed_batch(broker_pb2.PublishRequest(topic="t", packed_records=[record, b"\x2a\x01x\x2a\x01y"]))


def test_both_forms_and_a_malformed_record_are_refused() -> None:
    with pytest.raises(errors.InvalidArgument, match="either records or packed_records"):
        packed.packed_batch(broker_pb2.PublishRequest(topic="t", records=[R(value=b"a")], packed_records=[b""]))
    bad = broker_pb2.PublishRequest(topic="t", packed_records=[b"", b"\x2a\x09abc"])
    with pytest.raises(errors.InvalidArgument, match=r"packed record 1 \(5 bytes\) is not a PublishRecord"):
        packed.packed_batch(bad)


@pytest.fixture
def log() -> Iterator[TopicLog]:
    state = BrokerStateMachine(MemoryStore(), Changes())
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    topic_log = TopicLog(state, submitter, Limits(record_bytes_max=1000, batch_bytes_max=5000), "c/n1", ManualClock())
    for name in ("t", "u"):
        topic_log.create_topic(internal_pb2.TopicConfig(name=name, partitions=4))
    yield topic_log
    replicator.close()


def both(log: TopicLog, *records: R, **fields: object) -> tuple[Published, Published]:
    """The same records published as the old form to topic u and packed to topic t."""
    old = log.publish_placed(wire.publish_batch(broker_pb2.PublishRequest(topic="u", records=records,
                                                                           **fields)))  # type: ignore[arg-type]
    new = log.publish_placed(wire.publish_batch(request(*records, **fields)))
    return old, new


def test_the_lean_paths_place_and_store_as_the_old_form(log: TopicLog) -> None:
    batches = [[R(value=b"v%d" % i) for i in range(9)],
               [R(value=b"v%d" % i, **({"key": b"k%d" % i} if i % 2 else {})) for i in range(9)],  # type: ignore[arg-type]
               [R(value=b"a", partition=3), R(value=b"b", key=b"x"), R(value=b"c", headers={"h": "1"})]]
    for records in batches:
        old, new = both(log, *records)
        assert old.partitions == new.partitions and old.placements == new.placements
    for p in range(4):
        assert (log.describe_topic("t").partitions[p].end_offset == log.describe_topic("u").partitions[p].end_offset)


def test_the_lean_paths_refuse_with_the_old_messages(log: TopicLog) -> None:
    cases: list[tuple[list[R], dict[str, object]]] = [
        ([R(value=b"x" * 1200)], {}),
        ([R(value=b"x" * 900)] * 6, {}),
        ([R(value=b"a")], {"dedup_id": "d"}),
        ([R(value=b"a")], {"dedup_id": "x" * 300, "first_msg_id": 1}),
        ([R(value=b"a", key=b"k")], {"dedup_id": "d", "first_msg_id": -1}),
        ([R(value=b"a")], {"first_msg_id": 1}),
        ([R(value=b"a", key=b"k")], {"first_msg_id": 5}),
        ([R(value=b"a")], {"dedup_id": "d", "first_msg_id": 2**63 - 1}),
        ([], {}),
    ]
    for records, fields in cases:
        messages = []
        for batch in (broker_pb2.PublishRequest(topic="u", records=records, **fields),  # type: ignore[arg-type]
                      request(*records, **fields)):
            with pytest.raises(errors.InvalidArgument) as info:
                log.publish_placed(wire.publish_batch(batch))
            messages.append(str(info.value))
        assert messages[0] == messages[1], (records[:1], fields)
    assert all(p.end_offset == 0 for p in log.describe_topic("t").partitions), "nothing stored"


def test_compact_ranges_and_the_fall_back_to_per_record_results() -> None:
    fresh = Published(Appended([(1, 5, 70, False), (0, 9, 71, False), (1, 6, 70, False)]), [1, 0, 1])
    compact = wire.publish_response(fresh, broker_pb2.PublishRequest(results=broker_pb2.RESULT_FORM_COMPACT))
    assert not compact.results and list(compact.partitions) == [1, 0, 1]
    assert [(r.partition, r.base_offset, r.count, r.timestamp_ms) for r in compact.ranges] == [
        (1, 5, 2, 70), (0, 9, 1, 71)]
    assert [(r.partition, r.offset, r.timestamp_ms) for r in client_wire.publish_results(compact, 3, None)] == [
        (1, 5, 70), (0, 9, 71), (1, 6, 70)]
    per_record = wire.publish_response(fresh, broker_pb2.PublishRequest())
    assert len(per_record.results) == 3 and not per_record.ranges
    duplicate = Published(Appended([(1, 5, 70, True), (0, 9, 71, False)]), [1, 0])
    assert packed.compact_response(duplicate) is None
    gap = Published(Appended([(1, 5, 70, False), (1, 7, 70, False)]), [1, 1])
    assert packed.compact_response(gap) is None, "not consecutive: per record"
    stamps = Published(Appended([(1, 5, 70, False), (1, 6, 71, False)]), [1, 1])
    assert packed.compact_response(stamps) is None, "two timestamps: per record"
    short = broker_pb2.PublishResponse(partitions=[1], ranges=[broker_pb2.PartitionRange(partition=1, count=2)])
    with pytest.raises(BrokerError, match="places for 1 records"):
        client_wire.publish_results(short, 1, None)
    unranged = broker_pb2.PublishResponse(partitions=[1, 2], ranges=[broker_pb2.PartitionRange(partition=1, count=2)])
    with pytest.raises(BrokerError, match="no range for partitions \\[2\\]"):
        client_wire.publish_results(unranged, 2, None)
    with pytest.raises(BrokerError, match="3 results for 2 records"):
        client_wire.publish_results(per_record, 2, None)


def test_publish_results_are_checked_at_once_and_made_when_first_read() -> None:
    """A batch's results are a read-only sequence: the answer is checked when it arrives (above),
    the per-record objects are made once, at the first read, and it reads as the list it stands for."""
    fresh = Published(Appended([(1, 5, 70, False), (0, 9, 71, False), (1, 6, 70, False)]), [1, 0, 1])
    compact = wire.publish_response(fresh, broker_pb2.PublishRequest(results=broker_pb2.RESULT_FORM_COMPACT))
    per_record = wire.publish_response(fresh, broker_pb2.PublishRequest())
    for response, keys in ((compact, None), (per_record, ["a", "b", "c"])):
        results = client_wire.publish_results(response, 3, keys)
        assert isinstance(results, PublishResults) and len(results) == 3
        assert results._made is None, "nothing made before a read"
        sent = keys or ["", "", ""]
        expected = [PublishResult(1, 5, False, 70, sent[0]), PublishResult(0, 9, False, 71, sent[1]),
                    PublishResult(1, 6, False, 70, sent[2])]
        assert results == expected and expected == results and list(results) == expected
        made = results._made
        assert results[0] == expected[0] and results[-1] == expected[2] and results[1:] == expected[1:]
        assert results._made is made, "made once"
        assert results + [expected[0]] == [*expected, expected[0]]
        assert [expected[0]] + results == [expected[0], *expected]
        assert repr(results) == repr(expected) and results != expected[:2] and results != "x"
        assert [*results] == expected and sum(1 for _ in results) == 3


def sent(call: client_wire.PublishCall | None) -> broker_pb2.PublishRequest:
    """The request ``call`` sends (outside a session), parsed."""
    assert call is not None
    return broker_pb2.PublishRequest.FromString(call.data())


def test_the_sdk_packs_each_record_as_its_message() -> None:
    records = [OutgoingRecord(b"v"), OutgoingRecord("", key="k"), OutgoingRecord(b"x" * 300, key=b"y" * 200),
               OutgoingRecord("v", op="tombstone"), OutgoingRecord("v", partition=2, headers={"a": "b"})]
    for record in records:
        assert client_wire.pack_record(record) == client_wire.publish_record(record, "").SerializeToString()
    assert client_wire.pack_record(records[0], "idem", 5) == client_wire.publish_record(records[0], "idem",
                                                                                        5).SerializeToString()
    values: list[bytes | str] = [b"", "", b"v", "ü", b"x" * 127, b"x" * 128, "y" * 20000]
    values += [b"x" * n for n in (124, 125, 126, 127, 16381, 16382, 16383, 16384)]
    class Bytes(bytes):
        pass

    only_bytes = [v for v in values if type(v) is bytes]  # every step in C
    for batch in (values, only_bytes, [Bytes(v) for v in only_bytes], [*only_bytes, Bytes(b"z" * 200)]):
        bare = client_wire.publish_request("t", batch, None, None)
        assert bare is not None and bare.keys is None and list(sent(bare).packed_records) == [
            client_wire.publish_record(OutgoingRecord(v), "").SerializeToString() for v in batch]
    call = client_wire.publish_request("t", [b"a", "b"], None, None)
    assert call is not None and call.keys is None and call.count == 2 and call.in_session
    request = sent(call)
    assert request.results == broker_pb2.RESULT_FORM_COMPACT and not request.records and request.topic == "t"
    assert [R.FromString(d).value for d in request.packed_records] == [b"a", b"b"]
    assert not request.dedup_id and not request.first_msg_id
    lean = packed.packed_batch(request)
    assert lean.bodies is not None, "the SDK's plain records take the lean path"
    in_session = broker_pb2.PublishRequest.FromString(call.data("sdk-1", 41))
    assert (in_session.dedup_id, in_session.first_msg_id) == ("sdk-1", 41)
    assert in_session.packed_records == request.packed_records
    assert sent(call) == request, "a session's fields do not stay on the call"
    keyed = client_wire.publish_request("t", [OutgoingRecord("a", key="k"), b"b"], None, None)
    assert keyed is not None and packed.packed_batch(sent(keyed)).keys == [b"k", None]
    own = client_wire.publish_request("t", [b"a", b"b"], "mine", 7)
    assert own is not None and not own.in_session
    assert [(R.FromString(d).value, R.FromString(d).msg_id) for d in sent(own).packed_records] == [(b"a", 7), (b"b", 8)]
    assert sent(own).dedup_id == "mine"
    assert client_wire.publish_request("t", [], None, None) is None
    with pytest.raises(InvalidArgument, match="unknown op"):
        client_wire.publish_request("t", [OutgoingRecord("a", op="upsert")], None, None)
