"""Translation between SDK values and protobuf messages."""

from __future__ import annotations

import dataclasses
import re

import pytest

from broker.client import BrokerError, InvalidArgument, OutgoingRecord, Retention, wire
from broker.client.errors import error_from_rpc
from broker.client.models import OPS, Record
from broker.v1 import admin_pb2, broker_pb2, common_pb2

pytestmark = pytest.mark.unit


def test_topic_config_carries_every_option() -> None:
    cfg = wire.topic_config("t", 3, {"max_records": 10, "max_age_ms": None}, "fsync", "reject")
    assert cfg.partitions == 3 and cfg.retention.max_records == 10
    assert not cfg.retention.HasField("max_age_ms")
    assert cfg.durability == common_pb2.DURABILITY_FSYNC and cfg.full_policy == common_pb2.FULL_POLICY_REJECT
    assert wire.topic_config("t", 1, Retention(max_bytes=5), None, None).retention.max_bytes == 5


def test_topic_info_round_trips_names_and_unset_retention() -> None:
    msg = admin_pb2.TopicInfo(
        config=admin_pb2.TopicConfig(name="t", partitions=2, durability=common_pb2.DURABILITY_MEMORY,
                                     full_policy=common_pb2.FULL_POLICY_DISCARD_OLD),
        partitions=[admin_pb2.PartitionInfo(partition=0, end_offset=4, records=4, bytes=40),
                    admin_pb2.PartitionInfo(partition=1, start_offset=1, end_offset=2, records=1, bytes=9)],
    )
    msg.config.retention.max_records = 7
    info = wire.topic_info(msg)
    assert (info.durability, info.full_policy, info.partition_count) == ("memory", "discard_old", 2)
    assert info.retention == Retention(max_records=7)
    assert (info.records, info.bytes) == (5, 49)


@pytest.mark.parametrize(
    ("start", "timestamp_ms", "field", "value"),
    [
        ("earliest", None, "start", common_pb2.START_POSITION_EARLIEST),
        ("latest", None, "start", common_pb2.START_POSITION_LATEST),
        (0, None, "offset", 0),
        (17, None, "offset", 17),
        (b"\x01tok", None, "token", b"\x01tok"),
        ("earliest", 1_700_000_000_000, "timestamp_ms", 1_700_000_000_000),
    ],
)
def test_positions(start: str | int | bytes, timestamp_ms: int | None, field: str, value: object) -> None:
    pos = wire.position(start, timestamp_ms)
    assert pos.WhichOneof("kind") == field and getattr(pos, field) == value


def test_publish_record_keeps_key_partition_headers_and_op() -> None:
    msg = wire.publish_record(OutgoingRecord("v", key="k", partition=2, headers={"a": "b"}, op="delete"), "idem")
    assert (msg.value, msg.key, msg.partition, dict(msg.headers)) == (b"v", b"k", 2, {"a": "b"})
    assert msg.op == common_pb2.OP_DELETE and msg.idempotency_key == "idem"
    bare = wire.publish_record(OutgoingRecord(b"\xff"), "")
    assert not bare.HasField("key") and not bare.HasField("partition")


def test_bad_record_shapes_are_invalid_arguments() -> None:
    for bad in ({"key": "k"}, {"value": "v", "colour": 1}, 3.5):
        with pytest.raises(InvalidArgument):
            wire.outgoing(bad)  # type: ignore[arg-type]


def test_record_and_event_conversion() -> None:
    rec = wire.record(common_pb2.Record(topic="t", partition=1, offset=2, value=b"v", position=b"p",
                                        op=common_pb2.OP_TOMBSTONE))
    assert rec.key is None and rec.op == "tombstone" and rec.position == b"p"
    ev = wire.event(common_pb2.Event(type=common_pb2.EVENT_TYPE_SKIP_FORWARD, partition=1, offset_before=3,
                                     offset_after=9))
    assert (ev.type, ev.offset_before, ev.offset_after) == ("skip_forward", 3, 9)


def test_unknown_status_codes_become_the_base_error() -> None:
    import grpc

    class Err(grpc.RpcError, grpc.Call):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.ABORTED

        def details(self) -> str:
            return "no"

        def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
            return ()

    err = error_from_rpc(Err())
    assert type(err).__name__ == "BrokerError" and err.code == "ABORTED"
    assert str(err) == "no (ABORTED)"


@pytest.mark.parametrize("fields", [
    {},
    {"key": b"", "op": common_pb2.OP_TOMBSTONE},
    {"key": b"k", "headers": {"a": "1", "é": "ü"}, "producer": "svc", "origin": "c/n1", "msg_id": "7",
     "op": common_pb2.OP_UPDATE},
    {"op": 99},  # an op this SDK does not know yet
], ids=["bare", "empty-key-tombstone", "every-field", "unknown-op"])
def test_a_delivered_record_is_what_its_constructor_makes(fields: dict[str, object]) -> None:
    msg = common_pb2.Record(topic="t", partition=3, offset=2**40, value=b"v", timestamp_ms=-5, position=b"p",
                            **fields)  # type: ignore[arg-type]
    made = wire.record(msg)
    op = msg.op
    expected = Record(topic="t", partition=3, offset=2**40, key=msg.key if msg.HasField("key") else None,
                      value=b"v", headers=dict(msg.headers), timestamp_ms=-5, position=b"p", producer=msg.producer,
                      op=OPS[op] if op < len(OPS) else f"unknown({op})", origin=msg.origin, msg_id=msg.msg_id)
    assert made == expected and type(made) is Record
    assert set(vars(made)) == {f.name for f in dataclasses.fields(Record)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.offset = 1  # type: ignore[misc]
    assert isinstance(made.headers, dict)
    made.headers["new"] = "x"  # each record has a dict of its own
    assert wire.record(msg).headers == dict(msg.headers)


def test_record_has_nothing_its_fast_construction_would_skip() -> None:
    """``wire.record`` fills ``__dict__`` directly: valid while Record has no __post_init__ and no slots."""
    assert not hasattr(Record, "__post_init__") and "__slots__" not in vars(Record)
    assert Record.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_a_compact_batch_expands_its_timestamp_runs_and_keeps_what_each_record_gave() -> None:
    msg = broker_pb2.CompactBatch(topic="t", partition=2, first_offset=40, timestamp_counts=[2, 1],
                                  timestamps_ms=[7, 9], next_position=b"tok")
    msg.records.add(value=b"a", key=b"k", op=common_pb2.OP_DELETE, headers={"h": "1"})
    msg.records.add(value=b"b")
    msg.records.add(op=99)
    batch = wire.compact_batch(broker_pb2.SubscribeResponse.FromString(
        broker_pb2.SubscribeResponse(compact=msg).SerializeToString()).compact)
    assert (batch.topic, batch.partition, batch.first_offset, batch.next_offset, len(batch)) == ("t", 2, 40, 43, 3)
    assert batch.values == [b"a", b"b", b""] and batch.timestamps_ms == [7, 7, 9]
    assert list(batch.offsets) == [40, 41, 42] and batch.next_position == b"tok"
    assert batch.keys() == [b"k", None, None] and batch.headers() == [{"h": "1"}, {}, {}]
    assert batch.ops() == ["delete", "insert", "unknown(99)"]


def test_a_compact_batch_whose_runs_do_not_cover_its_records_is_refused() -> None:
    msg = broker_pb2.CompactBatch(topic="t", timestamp_counts=[1], timestamps_ms=[7])
    msg.records.add(value=b"a")
    msg.records.add(value=b"b")
    with pytest.raises(BrokerError, match="gave 1 timestamps"):
        wire.compact_batch(msg)


def test_whole_records_become_a_batch_only_when_consecutive() -> None:
    msg = broker_pb2.RecordBatch()
    msg.records.add(topic="t", partition=1, offset=5, value=b"x", timestamp_ms=3, position=b"p5")
    msg.records.add(topic="t", partition=1, offset=6, value=b"y", timestamp_ms=4, position=b"p6")
    batch = wire.records_batch(msg)
    assert (batch.first_offset, batch.values, batch.timestamps_ms) == (5, [b"x", b"y"], [3, 4])
    assert batch.next_position == b"p6"
    msg.records[1].offset = 8
    with pytest.raises(BrokerError, match="not consecutive"):
        wire.records_batch(msg)


def test_a_slice_of_a_batch_keeps_its_records_and_the_position_only_at_its_end() -> None:
    msg = broker_pb2.CompactBatch(topic="t", partition=1, first_offset=10, timestamp_counts=[2, 2],
                                  timestamps_ms=[5, 6], next_position=b"tok")
    for i in range(4):
        msg.records.add(value=b"v%d" % i, origin=f"o{i}")
    batch = wire.compact_batch(msg)
    middle = batch.slice(1, 3)
    assert (middle.first_offset, middle.values, middle.timestamps_ms, middle.next_position) == (
        11, [b"v1", b"v2"], [5, 6], b"")
    assert middle.origins() == ["o1", "o2"] and list(middle.offsets) == [11, 12]
    tail = batch.slice(2, 4)
    assert (tail.first_offset, tail.next_offset, tail.next_position) == (12, 14, b"tok")
    assert batch.slice(0, 4).values == batch.values


@pytest.mark.parametrize(("build", "named"), [
    (lambda: wire.position(2**64, None), "start (an offset) must be between 0 and 2**64 - 1"),
    (lambda: wire.position("earliest", 2**63), "timestamp_ms must be between -2**63 and 2**63 - 1"),
    (lambda: wire.publish_record(OutgoingRecord(value=b"v", partition=2**32), ""), "partition must be between 0"),
    (lambda: wire.topic_config("t", 2**32, None, None, None), "partitions must be between 1 and 2**32 - 1"),
    (lambda: wire.topic_config("t", 1, {"max_bytes": 2**63}, None, None), "retention max_bytes must be between"),
    (lambda: wire.topic_config("t", 1, None, None, None, dedup_window_ms=2**63), "dedup_window_ms must be"),
    (lambda: wire.msg_ids([OutgoingRecord(value=b"a"), OutgoingRecord(value=b"b")], "d", 2**63 - 1),
     "the batch's last msg_id"),
    (lambda: wire.check_read_options(2**32, None), "max_batch must be between 0 and 2**32 - 1"),
])
def test_a_number_too_large_for_its_wire_field_is_refused_by_name(build: object, named: str) -> None:
    # protobuf itself raises a bare ValueError("Value out of range") that names no field
    with pytest.raises(InvalidArgument, match=re.escape(named)):
        build()  # type: ignore[operator]


def test_the_largest_numbers_a_field_holds_are_sent() -> None:
    assert wire.position(2**64 - 1, None).offset == 2**64 - 1
    assert wire.position("earliest", 2**63 - 1).timestamp_ms == 2**63 - 1
    assert wire.publish_record(OutgoingRecord(value=b"v", partition=2**32 - 1), "").partition == 2**32 - 1
    assert wire.msg_ids([OutgoingRecord(value=b"a")], "d", 2**63 - 1) == [2**63 - 1]
