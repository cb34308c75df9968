"""The stored and replicated format is apart from the public API, and still reads what was written
when it was not: internal.proto's config types (package ``broker.internal.v1``) keep the field
numbers and types of the public messages they replaced, so data directories, Raft logs and snapshots
written by earlier versions (whose ``TopicMeta``, ``CreateTopicCommand``, ``GroupMeta``, ... embedded
the public ``TopicConfig``, ``GroupConfig``, ``RouteConfig``) parse the same."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.protobuf.descriptor import Descriptor, EnumDescriptor
from google.protobuf.internal.encoder import _VarintBytes
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from broker.core.applied import Appended
from broker.leader.topic_log import PartitionFigures, Published, TopicView, append_command_pieces
from broker.services import wire
from broker.v1 import admin_pb2, broker_pb2, common_pb2, internal_pb2, routes_internal_pb2, routes_pb2

pytestmark = pytest.mark.unit


def full_topic_config() -> admin_pb2.TopicConfig:
    return admin_pb2.TopicConfig(
        name="orders.v2", partitions=12,
        retention=common_pb2.Retention(max_age_ms=86_400_000, max_records=1_000_000, max_bytes=1 << 30),
        full_policy=common_pb2.FULL_POLICY_REJECT, durability=common_pb2.DURABILITY_FSYNC,
        schema_json='{"type": "object", "properties": {"id": {"type": "string"}}}',
        dedup_fields=["id", "meta.lang"], dedup_window_ms=-1)


def full_group_config() -> common_pb2.GroupConfig:
    return common_pb2.GroupConfig(
        mode=common_pb2.DELIVERY_MODE_STREAM, visibility_timeout_ms=45_000, backoff=common_pb2.BACKOFF_FIXED,
        base_delay_ms=250, max_delay_ms=9_000, max_attempts=7, ordered=True, session_timeout_ms=12_000,
        max_pending=321, start_from=common_pb2.Position(timestamp_ms=1_700_000_000_000))


def full_route_config() -> routes_pb2.RouteConfig:
    return routes_pb2.RouteConfig(name="r1", source="a", target="b", filter='value.kind == "x"',
                                  partition_key="value.user", ops=[common_pb2.OP_INSERT, common_pb2.OP_TOMBSTONE],
                                  target_cluster=["10.0.0.1:7000", "10.0.0.2:7000"])


def unknown(message: Message) -> int:
    return len(UnknownFieldSet(message))


def length_delimited(field_number: int, body: bytes) -> bytes:
    return _VarintBytes(field_number << 3 | 2) + _VarintBytes(len(body)) + body


def embedded(field_number: int, inner: Message) -> bytes:
    """``inner`` as a field of an enclosing message, encoded as earlier versions wrote it."""
    return length_delimited(field_number, inner.SerializeToString())


def shape(descriptor: Descriptor | EnumDescriptor) -> object:
    """Everything about a message or enum that decides how its bytes parse (names included: the
    JSON and text forms use them), recursively; type names are left out (they differ by package)."""
    if isinstance(descriptor, EnumDescriptor):
        return sorted((v.name, v.number) for v in descriptor.values)
    fields = []
    for f in sorted(descriptor.fields, key=lambda f: f.number):
        nested = f.message_type or f.enum_type
        fields.append((f.number, f.name, f.type, f.is_repeated, f.is_packed, f.has_presence,
                       f.containing_oneof.name if f.containing_oneof else None,
                       shape(nested) if nested is not None else None))
    return fields


@pytest.mark.parametrize(("public", "internal"), wire.TWINS, ids=lambda t: t.__name__)
def test_each_internal_config_type_has_the_shape_of_the_public_one_it_replaced(
        public: type[Message], internal: type[Message]) -> None:
    assert internal.DESCRIPTOR.full_name.startswith("broker.internal.v1.")
    assert shape(internal.DESCRIPTOR) == shape(public.DESCRIPTOR)


def test_internal_proto_imports_no_public_proto() -> None:
    files = {internal_pb2.DESCRIPTOR, routes_internal_pb2.DESCRIPTOR}
    seen: set[str] = set()
    while files:
        f = files.pop()
        seen.add(f.name)
        assert f.package == "broker.internal.v1", f.name
        files |= {d for d in f.dependencies if d.name not in seen}
    assert seen == {"broker/v1/internal.proto", "broker/v1/routes_internal.proto", "broker/v1/internal_types.proto"}


@pytest.mark.parametrize(("container", "number", "field", "public"), [
    (internal_pb2.TopicMeta, 1, "config", full_topic_config()),
    (internal_pb2.CreateTopicCommand, 1, "config", full_topic_config()),
    (internal_pb2.AlterTopicCommand, 3, "retention", full_topic_config().retention),
    (internal_pb2.GroupMeta, 6, "config", full_group_config()),
    (internal_pb2.CreateGroupCommand, 4, "config", full_group_config()),
    (routes_internal_pb2.RouteMeta, 1, "config", full_route_config()),
    (routes_internal_pb2.CreateRouteCommand, 1, "config", full_route_config()),
], ids=lambda v: v.__name__ if isinstance(v, type) else None)
def test_values_written_with_the_public_config_parse_with_the_internal_one_and_back(
        container: type[Message], number: int, field: str, public: Message) -> None:
    old_bytes = embedded(number, public)
    stored = container.FromString(old_bytes)
    inner = getattr(stored, field)
    assert not unknown(stored) and not unknown(inner)
    assert inner.SerializeToString(deterministic=True) == public.SerializeToString(deterministic=True)
    assert stored.SerializeToString(deterministic=True) == old_bytes
    back = type(public).FromString(inner.SerializeToString())
    assert back == public


def test_a_create_topic_command_of_an_earlier_version_replays_with_every_config_field() -> None:
    public = full_topic_config()
    old_create = embedded(1, public) + _VarintBytes(2 << 3) + _VarintBytes(1_234)  # config, now_ms
    command = internal_pb2.Command.FromString(length_delimited(1, old_create))  # Command.create_topic
    assert command.WhichOneof("body") == "create_topic" and command.create_topic.now_ms == 1_234
    config = command.create_topic.config
    assert wire.public_topic_config(config) == public
    assert (config.name, config.partitions, config.dedup_window_ms) == ("orders.v2", 12, -1)
    assert config.retention.HasField("max_age_ms") and config.retention.max_bytes == 1 << 30
    assert config.full_policy == internal_pb2.FULL_POLICY_REJECT
    assert config.durability == internal_pb2.DURABILITY_FSYNC
    assert list(config.dedup_fields) == ["id", "meta.lang"]


def test_translation_to_internal_and_back_is_lossless_and_drops_nothing_known() -> None:
    assert wire.public_topic_config(wire.topic_config(full_topic_config())) == full_topic_config()
    assert wire.public_group_config(wire.group_config(full_group_config())) == full_group_config()
    assert wire.public_route_config(wire.route_config(full_route_config())) == full_route_config()
    assert wire.retention(full_topic_config().retention).max_records == 1_000_000
    assert wire.position(common_pb2.Position(token=b"tok")).token == b"tok"


def test_a_public_field_the_internal_type_does_not_know_is_not_stored() -> None:
    newer = full_topic_config().SerializeToString() + _VarintBytes(99 << 3) + _VarintBytes(5)
    parsed = admin_pb2.TopicConfig.FromString(newer)  # a newer client's field, unknown here
    assert unknown(parsed) and not unknown(wire.topic_config(parsed))


def test_publish_translation_leaves_the_request_alone_and_stores_the_same_body_bytes() -> None:
    records = [broker_pb2.PublishRecord(key=b"k", value=b"v", headers={"h": "1"}, op=common_pb2.OP_DELETE,
                                        partition=3, idempotency_key="idem", msg_id=7),
               broker_pb2.PublishRecord(value=b"w")]
    request = broker_pb2.PublishRequest(topic="t", records=records, dedup_id="d")
    before = request.SerializeToString(deterministic=True)
    batch = wire.publish_batch(request)
    assert request.SerializeToString(deterministic=True) == before
    assert [(r.partition, r.idempotency_key, r.msg_id) for r in batch.records] == [(3, "idem", 7), (None, "", 0)]
    assert batch.dedup_id == "d" and batch.topic == "t"
    for rec, item in zip(records, batch.records, strict=True):
        old = broker_pb2.PublishRecord()
        old.CopyFrom(rec)
        for name in ("partition", "idempotency_key", "msg_id"):  # what TopicLog._bodies used to clear
            old.ClearField(name)
        assert item.body == old.SerializeToString()
        body = internal_pb2.RecordBody.FromString(item.body)
        assert not unknown(body) and (body.value, dict(body.headers), body.op) == (rec.value, dict(rec.headers), rec.op)
        assert item.key == (rec.key if rec.HasField("key") else None) and item.value == rec.value
    assert not internal_pb2.RecordBody.FromString(batch.records[1].body).HasField("key")


def test_results_are_translated_to_the_public_answers() -> None:
    placed = Published(Appended([(1, 5, 1000, False), (0, 9, 1001, True)]), [1, 0])
    response = wire.publish_response(placed, broker_pb2.PublishRequest())
    assert [(r.partition, r.offset, r.timestamp_ms, r.duplicate) for r in response.results] == [
        (1, 5, 1000, False), (0, 9, 1001, True)]
    view = TopicView(config=wire.topic_config(full_topic_config()), incarnation=4, created_ms=77,
                     partitions=[PartitionFigures(0, 2, 10, 8, 800)])
    info = wire.topic_info(view)
    assert info.config == full_topic_config() and info.incarnation == 4 and info.has_schema
    assert [(p.partition, p.start_offset, p.end_offset, p.records, p.bytes) for p in info.partitions] == [
        (0, 2, 10, 8, 800)]
    listed = wire.topic_info(view, with_schema=False)
    assert listed.config.schema_json == "" and listed.has_schema
    assert view.config.schema_json, "the view is left alone"


def test_a_stored_body_read_by_the_leader_side_reaches_the_client_as_the_public_record_did() -> None:
    """The leader merges stored bodies into internal Records; wire makes the whole response public
    by its bytes: the same response as merging the body into the public Record (the old path),
    unknown fields of the body included, and events keep every field."""
    body = internal_pb2.RecordBody(key=b"k", value=b"v", headers={"h": "1"}, producer="alice",
                                   op=internal_pb2.OP_TOMBSTONE, origin="c1/r1", msg_id="7").SerializeToString()
    body += length_delimited(99, b"from a later version")
    response = internal_pb2.SubscribeResponse()
    rec = response.batch.records.add()
    rec.MergeFromString(body)
    rec.topic, rec.partition, rec.offset, rec.timestamp_ms, rec.position = "t", 2, 41, 1234, b"tok"
    rec.delivery_attempt = 3
    old = broker_pb2.SubscribeResponse()
    public_rec = old.batch.records.add()
    public_rec.MergeFromString(body)
    public_rec.topic, public_rec.partition, public_rec.offset, public_rec.timestamp_ms = "t", 2, 41, 1234
    public_rec.position, public_rec.delivery_attempt = b"tok", 3
    translated = wire.subscribe_response(response)
    assert isinstance(translated, broker_pb2.SubscribeResponse)
    assert translated == old and translated.SerializeToString() == old.SerializeToString()
    assert translated.batch.records[0].op == common_pb2.OP_TOMBSTONE and unknown(translated.batch.records[0]) == 1
    event = internal_pb2.SubscribeResponse(event=internal_pb2.Event(
        type=internal_pb2.EVENT_TYPE_BADMSG, topic="t", partition=1, offset_before=5, offset_after=6,
        position_before=b"a", position_after=b"b", detail="record skipped"))
    assert wire.subscribe_response(event) == broker_pb2.SubscribeResponse(event=common_pb2.Event(
        type=common_pb2.EVENT_TYPE_BADMSG, topic="t", partition=1, offset_before=5, offset_after=6,
        position_before=b"a", position_after=b"b", detail="record skipped"))


def test_dead_letters_are_translated_with_their_record() -> None:
    dead = internal_pb2.DeadLetter(partition=1, offset=2, attempts=3, reason="max attempts", dead_ms=9,
                                   dlq_partition=0, dlq_offset=4,
                                   record=internal_pb2.Record(topic="t.dlq", value=b"v", op=internal_pb2.OP_UPDATE))
    response = wire.dead_letters([dead, internal_pb2.DeadLetter(partition=0, offset=7)])
    assert [d.SerializeToString() for d in response.dead_letters] == [
        dead.SerializeToString(), internal_pb2.DeadLetter(partition=0, offset=7).SerializeToString()]
    assert response.dead_letters[0].record.value == b"v" and not response.dead_letters[1].HasField("record")


def test_public_steps_translate_responses_pass_idles_and_close_the_leader_stream() -> None:
    from broker.leader.reading import Idle, Step

    closed: list[bool] = []

    def steps() -> Iterator[Step]:
        try:
            yield internal_pb2.SubscribeResponse(event=internal_pb2.Event(type=internal_pb2.EVENT_TYPE_GAP))
            yield Idle(3, 0.5)
            yield internal_pb2.SubscribeResponse()
        finally:
            closed.append(True)

    public = wire.public_steps(steps())
    first = next(public)
    assert isinstance(first, broker_pb2.SubscribeResponse) and first.event.type == common_pb2.EVENT_TYPE_GAP
    assert next(public) == Idle(3, 0.5)
    public.close()  # type: ignore[attr-defined]
    assert closed == [True]


@pytest.mark.parametrize("sizes", [[], [0], [1, 126, 127, 128], [16_000, 16_400, 2_100_000]])
@pytest.mark.parametrize("suffix", [b"", internal_pb2.RecordBody(origin="c1/n1", producer="alice").SerializeToString()])
def test_a_publish_command_built_from_pieces_is_the_message_it_stands_for(sizes: list[int], suffix: bytes) -> None:
    """``TopicLog`` submits a publish as bytes joined from pieces (``append_command_pieces``); they
    must parse as the ``Command`` built as a message, whatever the lengths (one- to three-byte varints
    for a body and for the whole ``append``), with the bodies' lengths given or measured, and the
    size the pieces state is the joined command's."""
    bodies = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    append = internal_pb2.AppendCommand(topic="t", topic_id=7, now_ms=1_700_000_000_000,
                                        partitions=[i % 3 for i in range(len(sizes))], dedup_id="sdk-1",
                                        first_msg_id=41, idempotency_keys=["k"] * len(sizes))
    expected = internal_pb2.Command()
    expected.append.CopyFrom(append)
    expected.append.bodies.extend(body + suffix for body in bodies)
    pieces = append_command_pieces(append, bodies, suffix)
    data = pieces.joined()
    assert internal_pb2.Command.FromString(data) == expected
    assert len(data) == expected.ByteSize() == pieces.size
    given = append_command_pieces(append, bodies, suffix, lengths=[len(b) for b in bodies])
    assert given.joined() == data and given.size == pieces.size
    assert not append.bodies, "the message given is left as it was"
