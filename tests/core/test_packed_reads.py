"""Stateless reads answered as bytes (``broker.leader.packed_reads``): the same responses, bounds and
events as the per-record path, item for item, on MemoryStore; unreadable records stay BADMSG."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import DecodeError

from broker import protowire
from broker.core import record_log, records
from broker.core.record_log import Entry
from broker.leader import packed_reads
from broker.leader.packed_reads import BatchWriter, CompactWriter, PackedBatch
from broker.leader.reading import Idle, Reader
from broker.protowire import varint
from broker.services import wire
from broker.storage import Column
from broker.v1 import broker_pb2, common_pb2, internal_pb2
from tests.core.groups_env import Env, make_env
from tests.core.wire_inputs import publish_request
from tests.record_store import flip_record_byte, frame_span, value_format

pytestmark = pytest.mark.unit


@pytest.fixture
def env() -> Iterator[Env]:
    e = make_env()
    yield e
    e.replicator.close()


def request(topic: str, **fields: object) -> broker_pb2.SubscribeRequest:
    return broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True, **fields)  # type: ignore[arg-type]


def read(env: Env, req: broker_pb2.SubscribeRequest, packed: bool, bytes_max: int = 1 << 20
         ) -> list[internal_pb2.SubscribeResponse]:
    """Every response of a stop-at-end subscription, packed ones parsed (as a client does)."""
    out = []
    steps = Reader(env.state, response_bytes_max=bytes_max).subscribe_steps(
        wire.subscription(req), lambda: True, packed=packed)
    for step in steps:
        assert not isinstance(step, Idle)
        if isinstance(step, PackedBatch):
            assert packed
            parsed = internal_pb2.SubscribeResponse.FromString(step.data)
            records = parsed.compact.records if req.compact else parsed.batch.records
            assert step.records == len(records) > 0
            out.append(parsed)
        else:
            out.append(step)
    return out


def assert_same(env: Env, req: broker_pb2.SubscribeRequest, bytes_max: int = 1 << 20) -> list[
        internal_pb2.SubscribeResponse]:
    plain = read(env, req, packed=False, bytes_max=bytes_max)
    packed = read(env, req, packed=True, bytes_max=bytes_max)
    assert packed == plain
    return packed


def publish_varied(env: Env, topic: str, n: int) -> None:
    """Records with every body field: keys (some empty), headers, ops, and no value at all."""
    records = []
    for i in range(n):
        rec = broker_pb2.PublishRecord(value=b"v%d" % i * (i % 5) if i % 7 else b"", op=i % 4)  # type: ignore[arg-type]
        if i % 3:
            rec.key = b"k%d" % (i % 4) if i % 6 else b""
        if i % 2:
            rec.headers["h"] = f"é{i}"
        records.append(rec)
    env.log.publish(publish_request(topic=topic, records=records))


@pytest.mark.parametrize("varint_of", [0, 1, 127, 128, 300, 16_383, 16_384, 2**31, 2**63 - 1, 2**64 - 1])
def test_varint_is_protobufs(varint_of: int) -> None:
    assert varint(varint_of) == _VarintBytes(varint_of)


def test_heads_by_length_are_made_once_and_kept_up_to_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []

    def head(n: int) -> bytes:
        made.append(n)
        return b"\x2a" + varint(n)

    heads = protowire.ByLength(head)
    assert list(map(heads.__getitem__, [5, 300, 5, 300])) == [b"\x2a\x05", b"\x2a" + varint(300)] * 2
    assert made == [5, 300] and dict(heads) == {5: b"\x2a\x05", 300: b"\x2a\xac\x02"}
    monkeypatch.setattr(protowire, "LENGTHS_KEPT", 2)
    assert heads[16_384] == b"\x2a" + _VarintBytes(16_384) and heads[16_384] == heads[16_384]
    assert 16_384 not in heads and made == [5, 300, 16_384, 16_384, 16_384], "past the bound: made, not kept"


def test_every_start_and_batch_size_reads_the_same_records_and_tokens(env: Env) -> None:
    env.topic("t", partitions=3)
    for _ in range(4):
        publish_varied(env, "t", 40)
    meta = env.state.topic("t")
    assert meta is not None
    shortest = min(env.state.partition(meta.topic_id, p).end_offset for p in range(3))
    assert shortest > 4
    for start in (0, 1, shortest // 2, shortest - 1):
        for max_batch in (0, 1, 7, 1000):
            for partition in (None, 0, 2):
                req = request("t", max_batch=max_batch, **{"from": common_pb2.Position(offset=start)},
                              **({} if partition is None else {"partition": partition}))
                assert_same(env, req)
    whole = assert_same(env, request("t", partition=1))
    records = [r for resp in whole for r in resp.batch.records]
    assert [r.offset for r in records] == list(range(len(records)))
    resumed = assert_same(env, request("t", **{"from": common_pb2.Position(token=records[9].position)}))
    assert [r.offset for resp in resumed for r in resp.batch.records][0] == 10


def test_the_response_byte_bound_splits_where_the_per_record_path_does(env: Env) -> None:
    env.topic("t")
    env.publish("t", [bytes([i]) * (50 * i) for i in range(60)])
    for bytes_max in (1, 200, 3_000, 40_000):
        responses = assert_same(env, request("t"), bytes_max=bytes_max)
        if bytes_max == 1:
            assert all(len(r.batch.records) == 1 for r in responses)


def test_a_corrupt_record_is_badmsg_alone_between_packed_responses(env: Env) -> None:
    env.topic("t")
    env.publish("t", [b"r%d" % i for i in range(7)])
    meta = env.state.topic("t")
    assert meta is not None
    flip_record_byte(env.state.store, meta.topic_id, 0, 3)
    responses = assert_same(env, request("t"))
    kinds = [("event", r.event.type) if r.HasField("event") else [x.offset for x in r.batch.records]
             for r in responses]
    assert kinds == [[0, 1, 2], ("event", common_pb2.EVENT_TYPE_BADMSG), [4, 5, 6]]


@pytest.mark.parametrize("bad_body", [b"\x2a\xff", b"\x2a\x05ab", b"\x2a", b"\x32\x03\x0a\x01\xff"],
                         ids=["past-the-record", "past-the-body", "cut-tag", "bad-utf8-header"])
def test_a_body_that_passes_its_crc_but_does_not_parse_is_badmsg_not_a_broken_stream(env: Env, bad_body: bytes) -> None:
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c"])
    meta = env.state.topic("t")
    assert meta is not None
    entries = list(record_log.read(env.state.store, meta.topic_id, 0, 0, 3))
    assert len({e.timestamp_ms for e in entries}) == 1, "one publish: one timestamp"
    bodies = [e.body for e in entries]
    bodies[1] = bad_body  # CRC fine, no RecordBody
    batch = env.state.store.batch()
    record_log.append(batch, meta.topic_id, 0, 0, entries[0].timestamp_ms, bodies)  # same key: the value is replaced
    env.state.store.write(batch, sync=True)
    for packed in (False, True):
        responses = read(env, request("t"), packed=packed)
        records = [r.offset for resp in responses if resp.HasField("batch") for r in resp.batch.records]
        events = [(resp.event.type, resp.event.offset_before) for resp in responses if resp.HasField("event")]
        assert records == [0, 2] and events == [(common_pb2.EVENT_TYPE_BADMSG, 1)]


def test_filtered_ephemeral_and_blocking_reads_stay_messages(env: Env) -> None:
    env.log.create_topic(internal_pb2.TopicConfig(name="e", partitions=1, durability=internal_pb2.DURABILITY_EPHEMERAL))
    env.topic("t")
    env.publish("t", [b'{"a": 1}', b'{"a": 2}'])
    env.publish("e", [b"x"])
    steps = Reader(env.state).subscribe_steps(wire.subscription(request("t", filter="value.a == 2")), lambda: True,
                                              packed=True)
    assert [s.batch.records[0].offset for s in steps if not isinstance(s, Idle | PackedBatch)] == [1]
    for step in Reader(env.state).subscribe_steps(wire.subscription(request("e")), lambda: True, packed=True):
        assert not isinstance(step, PackedBatch)
    assert [r.offset for resp in Reader(env.state).subscribe(wire.subscription(request("t")), lambda: True)
            for r in resp.batch.records] == [0, 1]


def test_a_writer_refuses_a_response_it_cannot_parse() -> None:
    writer = BatchWriter("t", 1, 0, 5)
    # the value claims 5 bytes and holds 2: it must not swallow what follows it
    assert writer.take(iter([Entry(5, 10, b"\x2a\x05ab")]), 1 << 20, 16) is None
    assert writer.finish() is None
    good = BatchWriter("t", 1, 4, 5)
    gap = Entry(7, 10, b"")
    assert good.take(iter([Entry(5, 10, b"\x2a\x02ab"), gap, Entry(8, 10, b"")]), 1 << 20, 16) is gap
    done = good.finish()
    assert done is not None and done.records == 1
    [record] = internal_pb2.SubscribeResponse.FromString(done.data).batch.records
    assert (record.topic, record.partition, record.offset, record.timestamp_ms, record.value) == ("t", 4, 5, 10, b"ab")
    bad = Entry(6, 0, b"", "checksum mismatch")
    assert BatchWriter("t", 1, 4, 5).take(iter([Entry(5, 1, b""), bad]), 1 << 20, 16) is bad


# -- compact responses (SubscribeRequest.compact) ----------------------------------------------------
def expanded(compact: internal_pb2.CompactBatch) -> list[internal_pb2.Record]:
    """A compact response's records as whole records, as the plain path sends them (position aside)."""
    stamps = [ts for n, ts in zip(compact.timestamp_counts, compact.timestamps_ms, strict=True) for _ in range(n)]
    assert len(stamps) == len(compact.records)
    out = []
    for i, body in enumerate(compact.records):
        assert (body.topic, body.partition, body.offset, body.timestamp_ms, body.position) == ("", 0, 0, 0, b"")
        rec = internal_pb2.Record()
        rec.CopyFrom(body)
        rec.topic, rec.partition, rec.offset = compact.topic, compact.partition, compact.first_offset + i
        rec.timestamp_ms = stamps[i]
        out.append(rec)
    return out


def assert_compact_same(env: Env, req: broker_pb2.SubscribeRequest, bytes_max: int = 1 << 20
                        ) -> list[internal_pb2.SubscribeResponse]:
    """The compact responses carry the plain responses' records and events in the same order, and
    each one's ``next_position`` is the plain token of its last record."""
    plain = read(env, req, packed=False, bytes_max=bytes_max)
    tokens = {(rec.partition, rec.offset): rec.position for r in plain for rec in r.batch.records}
    want: list[object] = []
    for r in plain:
        if r.HasField("event"):
            want.append(r.event)
        for rec in r.batch.records:
            rec.position = b""
            want.append(rec)
    compact_req = broker_pb2.SubscribeRequest()
    compact_req.CopyFrom(req)
    compact_req.compact = True
    compact = read(env, compact_req, packed=True, bytes_max=bytes_max)
    got: list[object] = []
    for r in compact:
        if r.HasField("event"):
            got.append(r.event)
        elif r.HasField("batch"):  # around an unreadable record: whole records, as plain
            for rec in r.batch.records:
                rec.position = b""
                got.append(rec)
        else:
            got += expanded(r.compact)
            last = r.compact.first_offset + len(r.compact.records) - 1
            assert r.compact.next_position == tokens[(r.compact.partition, last)]
    assert got == want
    return compact


def test_compact_responses_carry_the_records_events_and_tokens_of_plain_ones(env: Env) -> None:
    env.topic("t", partitions=3)
    for _ in range(4):
        publish_varied(env, "t", 40)
        env.clock.advance(5)  # a timestamp run per publish
    meta = env.state.topic("t")
    assert meta is not None
    shortest = min(env.state.partition(meta.topic_id, p).end_offset for p in range(3))
    for start in (0, 1, shortest - 1):
        for max_batch in (0, 1, 7, 1000):
            for partition in (None, 0, 2):
                req = request("t", max_batch=max_batch, **{"from": common_pb2.Position(offset=start)},
                              **({} if partition is None else {"partition": partition}))
                responses = assert_compact_same(env, req)
                assert all(r.HasField("compact") for r in responses)
    whole = assert_compact_same(env, request("t", partition=1))
    assert len(whole) == 1 and len(whole[0].compact.timestamp_counts) == 4, "one run per publish"
    assert whole[0].compact.partition == 1 and whole[0].compact.first_offset == 0


def test_compact_responses_split_where_plain_ones_do_by_count_and_bytes_per_body(env: Env) -> None:
    env.topic("t")
    env.publish("t", [bytes([i]) * (50 * i) for i in range(60)])
    for bytes_max in (1, 200, 3_000, 40_000):
        responses = assert_compact_same(env, request("t"), bytes_max=bytes_max)
        if bytes_max == 1:
            assert all(len(r.compact.records) == 1 for r in responses)


def test_a_corrupt_record_is_badmsg_alone_between_compact_responses(env: Env) -> None:
    env.topic("t")
    env.publish("t", [b"r%d" % i for i in range(7)])
    meta = env.state.topic("t")
    assert meta is not None
    flip_record_byte(env.state.store, meta.topic_id, 0, 3)
    responses = assert_compact_same(env, request("t"))
    kinds = [r.WhichOneof("body") for r in responses]
    assert kinds == ["compact", "event", "batch"], "the rest of that read goes the per-record way"
    assert responses[1].event.type == common_pb2.EVENT_TYPE_BADMSG and responses[1].event.offset_before == 3
    assert len(responses[0].compact.records) == 3 and [r.offset for r in responses[2].batch.records] == [4, 5, 6]


def test_a_compact_request_with_a_filter_gets_whole_records() -> None:
    e = make_env()
    try:
        e.topic("t")
        e.publish("t", [b'{"a": 1}', b'{"a": 2}'])
        req = request("t", filter="value.a == 2", compact=True)
        steps = [s for s in Reader(e.state).subscribe_steps(wire.subscription(req), lambda: True, packed=True)
                 if not isinstance(s, Idle)]
        assert len(steps) == 1 and isinstance(steps[0], internal_pb2.SubscribeResponse)
        assert [r.offset for r in steps[0].batch.records] == [1]
    finally:
        e.replicator.close()


def test_a_compact_writer_refuses_a_response_it_cannot_parse_and_writes_far_offsets() -> None:
    writer = CompactWriter("t", 1, 0, 5)
    assert writer.take(iter([Entry(5, 10, b"\x2a\x05ab")]), 1 << 20, 16) is None
    assert writer.finish() is None
    far = 2**40
    good = CompactWriter("t", 1, 7, far)
    gap = Entry(far + 4, 10, b"")  # not the next offset
    rest = good.take(iter([Entry(far, -1, b"\x2a\x02ab"), Entry(far + 1, -1, b""), Entry(far + 2, 2**62, b"")]
                          + [gap]), 1 << 20, 16)
    assert rest is not None and list(rest) == [gap]
    done = good.finish()
    assert done is not None and done.records == 3
    public = broker_pb2.SubscribeResponse.FromString(done.data).compact
    assert (public.topic, public.partition, public.first_offset) == ("t", 7, far)
    assert (list(public.timestamp_counts), list(public.timestamps_ms)) == ([2, 1], [-1, 2**62])
    assert [r.value for r in public.records] == [b"ab", b"", b""]
    assert records.PositionToken.decode(public.next_position) == records.PositionToken(1, 7, far + 3)


def test_compact_reads_of_format_2_and_format_3_values_side_by_side(env: Env) -> None:
    """A store written before format 3 keeps its values; a compact read takes them record by record
    and the format-3 ones whole, in one response."""
    env.topic("t")
    meta = env.state.topic("t")
    assert meta is not None
    tid = meta.topic_id
    env.publish("t", [b"new-%d" % i for i in range(4)])
    old = [(e.timestamp_ms, e.body) for e in record_log.read(env.state.store, tid, 0, 0, 4)]
    batch = env.state.store.batch()  # offsets 0-3 rewritten in format 2, as an older version stored them
    batch.put(Column.RECORDS, *record_log.encode(tid, 0, 0, [
        records.frame(records.record_key(tid, 0, o), ts, body) for o, (ts, body) in enumerate(old)]))
    env.state.store.write(batch, sync=True)
    env.publish("t", [b"v3-%d" % i for i in range(5)])
    assert (value_format(env.state.store, tid, 0, 0), value_format(env.state.store, tid, 0, 4)) == (2, 3)
    for start in range(9):
        responses = assert_compact_same(env, request("t", **{"from": common_pb2.Position(offset=start)}))
        assert [r.WhichOneof("body") for r in responses] == ["compact"]


def test_a_damaged_element_prefix_is_badmsg_for_that_record_alone(env: Env) -> None:
    env.topic("t")
    env.publish("t", [b"r%d" % i for i in range(5)])
    meta = env.state.topic("t")
    assert meta is not None
    store = env.state.store
    [(key, value)] = list(store.scan(Column.RECORDS, records.record_key(meta.topic_id, 0, 0),
                                     records.record_key(meta.topic_id, 1, 0)))
    start, _ = frame_span(value, 2)
    batch = store.batch()
    batch.put(Column.RECORDS, key, value[:start] + b"\x12" + value[start + 1:])  # field 2, not 1
    store.write(batch, sync=True)
    responses = assert_compact_same(env, request("t"))
    events = [(r.event.type, r.event.offset_before) for r in responses if r.HasField("event")]
    assert events == [(common_pb2.EVENT_TYPE_BADMSG, 2)]


def test_a_span_larger_than_the_byte_bound_is_cut_between_records(env: Env) -> None:
    env.topic("t")
    env.publish("t", [bytes([i]) * 100 for i in range(50)])
    meta = env.state.topic("t")
    assert meta is not None
    body = next(record_log.read(env.state.store, meta.topic_id, 0, 0, 1)).body
    for bytes_max in (1, 150, 1_000, 2_000, 5_000):
        responses = assert_compact_same(env, request("t"), bytes_max=bytes_max)
        sizes = [len(r.compact.records) for r in responses]
        assert sum(sizes) == 50
        per = max(1, bytes_max // (len(body) + 2 + 16))  # an element: 0x0a, a 1-byte length, the body
        assert sizes[:-1] == [per] * (len(sizes) - 1), "as many whole records as fit, a lone one always"


# -- the response check (read_view.proto) against the internal twin ------------------------------
_GOOD_BODIES = [
    b"",
    internal_pb2.RecordBody(value=b"v" * 300).SerializeToString(),
    internal_pb2.RecordBody(key=b"", value=b"x").SerializeToString(),
    internal_pb2.RecordBody(key=b"k", value=b"\xff\x00", headers={"h": "é", "": ""}, producer="p",
                            op=internal_pb2.OP_DELETE, origin="o", msg_id="m").SerializeToString(),
    b"\x48\x07",  # an op outside the enum (an open enum: a plain number)
    b"\x7b\x08\x01\x7c",  # an unknown group, closed
    b"\xa8\x1f\x05",  # an unknown varint field (499)
    b"\x28\x01",  # field 5 as a varint: not the value, an unknown field
    b"\x2a\x01a\x2a\x02bc",  # the value twice
]
_BAD_BODIES = [
    b"\x2a\xff", b"\x2a\x05ab", b"\x2a", b"\x32\x03\x0a\x01\xff",  # as in the BADMSG test above
    b"\x42\x01\xff",  # producer not UTF-8
    b"\x0a\x01\xff",  # topic (a reader's field) not UTF-8
    b"\x32\x04\x12\x02\xc3\x28",  # a header value not UTF-8
    b"\x10" + b"\xff" * 10 + b"\x01",  # a varint of 11 bytes
    b"\x0c",  # an end-group with no start
    b"\x7b\x08\x01",  # a group never closed
    b"\x7b\x84\x01",  # a group closed by another field's end
    b"\x2f",  # wire type 7
]


def _mutated(rng: random.Random, body: bytes) -> bytes:
    """``body`` with one seeded change: a byte replaced, inserted or removed, or the end cut."""
    data = bytearray(body or b"\x2a\x00")
    at = rng.randrange(len(data))
    kind = rng.randrange(4)
    if kind == 0:
        data[at] = rng.randrange(256)
    elif kind == 1:
        data.insert(at, rng.randrange(256))
    elif kind == 2:
        del data[at]
    else:
        del data[at:]
    return bytes(data)


def _responses(body: bytes) -> dict[str, bytes]:
    """``body`` between two good records, in a compact and in a plain packed response."""
    good = _GOOD_BODIES[3]
    compact_records = b"".join(b"\x0a" + varint(len(b)) + b for b in (good, body, good))
    compact = compact_records + b"\x12\x01t\x20\x05\x2a\x01\x03\x32\x01\x07\x3a\x02zz"
    heads = [b"\x0a\x01t\x18" + varint(5 + i) + b"\x38\x07\x62\x02zz" for i in range(3)]
    plain = b"".join(b"\x0a" + varint(len(h + b)) + h + b for h, b in zip(heads, (good, body, good), strict=True))
    return {"compact": b"\x1a" + varint(len(compact)) + compact,
            "batch": b"\x0a" + varint(len(plain)) + plain}


def test_the_response_check_accepts_exactly_what_the_internal_twin_parses() -> None:
    """The reader's one-parse check (``read_view.proto``: the records merged into one message) accepts
    a response exactly when the internal ``SubscribeResponse`` parses it, for good bodies, damaged
    ones and 3,000 seeded mutations of good ones."""
    rng = random.Random(15)
    bodies = _GOOD_BODIES + _BAD_BODIES + [_mutated(rng, rng.choice(_GOOD_BODIES)) for _ in range(3000)]
    outcomes = {True: 0, False: 0}
    for body in bodies:
        for form, data in _responses(body).items():
            try:
                parsed = internal_pb2.SubscribeResponse.FromString(data)
            except DecodeError:
                parsed = None
            checked = packed_reads._checked(data, 3)
            assert (checked is None) == (parsed is None), (form, body)
            assert checked is None or (checked.data, checked.records) == (data, 3)
            outcomes[parsed is not None] += 1
    for body in _GOOD_BODIES:
        assert all(packed_reads._checked(d, 3) is not None for d in _responses(body).values()), body
    for body in _BAD_BODIES:
        assert all(packed_reads._checked(d, 3) is None for d in _responses(body).values()), body
    assert min(outcomes.values()) > 500, outcomes  # the mutations reach both sides of the check
