"""Translation between the SDK's plain values and the protobuf messages of ``broker.v1``.

Pure functions, no I/O. Input checks that need no server (types, enum names, the shape of a
start position) raise :class:`~broker.client.errors.InvalidArgument` here, before anything is sent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.client import packing
from broker.client.checks import (
    INT64_MAX,
    UINT32_MAX,
    UINT64_MAX,
    check_batch,
    check_int,
    check_str,
    in_range,
)
from broker.client.errors import BrokerError, TopicExists, invalid_argument
from broker.client.models import (
    DURABILITIES,
    EVENT_TYPES,
    FULL_POLICIES,
    OPS,
    Batch,
    ClusterStatus,
    Event,
    NodeDigest,
    NodeInfo,
    OutgoingRecord,
    PartitionInfo,
    PublishResult,
    Record,
    ReplicaVerification,
    Retention,
    TopicInfo,
    Watermark,
)
from broker.v1 import admin_pb2, broker_pb2, common_pb2

Start = str | int | bytes
_RETENTION_FIELDS = ("max_age_ms", "max_records", "max_bytes")
_RECORD_FIELDS = ("value", "key", "partition", "headers", "op", "idempotency_key", "msg_id")
PUBLISH_BATCH_RECORDS_MAX = 100_000  # a copy of broker.limits.Limits.batch_records_max (pinned by a test)
ID_CHARS_MAX = 256  # idempotency keys and dedup ids: a copy of broker.limits.ID_CHARS_MAX (pinned by a test)
DEDUP_FOREVER = -1
def to_bytes(value: bytes | str, what: str) -> bytes:
    """``value`` as bytes (str is encoded as UTF-8)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise invalid_argument(f"{what} must be bytes or str, got {type(value).__name__}")


def _enum_value(name: str | None, names: tuple[str, ...], prefix: str, what: str) -> str:
    """The proto enum value name for ``name`` (``None``: ``<PREFIX>_UNSPECIFIED``)."""
    if name is None:
        return f"{prefix}_UNSPECIFIED"
    if name not in names:
        raise invalid_argument(f"unknown {what} {name!r}; use one of {', '.join(names)}")
    return f"{prefix}_{name.upper()}"


def _enum_name(value: int, names: tuple[str, ...], offset: int = 1) -> str:
    index = value - offset
    return names[index] if 0 <= index < len(names) else f"unknown({value})"


def topic_config(
    name: str,
    partitions: int,
    retention: Mapping[str, int | None] | Retention | None,
    durability: str | None,
    full_policy: str | None,
    dedup_window_ms: int | None = None,
) -> admin_pb2.TopicConfig:
    """The ``TopicConfig`` of a create request (``dedup_window_ms`` ``None``: server default)."""
    check_str(name, "name (the topic name)")
    if not _is_int(partitions):
        raise invalid_argument(f"partitions must be an int, got {type(partitions).__name__}")
    if partitions <= 0:
        raise invalid_argument(f"partitions must be at least 1, got {partitions}")
    in_range(partitions, "partitions", 1, UINT32_MAX)
    if dedup_window_ms is not None and (
        not _is_int(dedup_window_ms) or (dedup_window_ms <= 0 and dedup_window_ms != DEDUP_FOREVER)
        or dedup_window_ms > INT64_MAX
    ):
        raise invalid_argument(
            f"dedup_window_ms must be a positive int or -1 (forever), got {dedup_window_ms!r}; "
            "None means the server default"
        )
    config = admin_pb2.TopicConfig(
        name=name,
        partitions=partitions,
        durability=_enum_value(durability, DURABILITIES, "DURABILITY", "durability"),
        full_policy=_enum_value(full_policy, FULL_POLICIES, "FULL_POLICY", "full_policy"),
        dedup_window_ms=dedup_window_ms or 0,
    )
    if retention is not None and not isinstance(retention, Retention | Mapping):
        raise invalid_argument(f"retention must be a dict or a Retention, got {type(retention).__name__}")
    caps = retention.__dict__ if isinstance(retention, Retention) else dict(retention or {})
    unknown = set(caps) - set(_RETENTION_FIELDS)
    if unknown:
        raise invalid_argument(f"unknown retention field(s) {sorted(unknown)}; use {_RETENTION_FIELDS}")
    for key, cap in caps.items():
        if cap is not None:
            setattr(config.retention, key, check_int(cap, f"retention {key}", 1, INT64_MAX))  # None: no cap
    return config


def create_topic_request(name: str, partitions: int, retention: Mapping[str, int | None] | Retention | None,
                         durability: str | None, full_policy: str | None, dedup_window_ms: int | None,
                         schema: Mapping[str, Any] | str | None,
                         dedup_fields: Sequence[str] | None) -> admin_pb2.CreateTopicRequest:
    """The ``CreateTopicRequest`` of both SDKs' ``create_topic``; every argument is checked here
    (InvalidArgument naming it and the expected type), before anything is sent."""
    request = admin_pb2.CreateTopicRequest(
        config=topic_config(name, partitions, retention, durability, full_policy, dedup_window_ms))
    if schema is not None:
        if not isinstance(schema, str | Mapping):
            raise invalid_argument(f"schema must be a dict or JSON text, got {type(schema).__name__}")
        try:
            request.config.schema_json = schema if isinstance(schema, str) else json.dumps(schema)
        except (TypeError, ValueError) as err:
            raise invalid_argument(f"schema cannot be written as JSON: {err}") from None
    if dedup_fields is not None:
        if isinstance(dedup_fields, str) or not isinstance(dedup_fields, Sequence):
            raise invalid_argument("dedup_fields must be a sequence of field names (str), not "
                                   + ("one string" if isinstance(dedup_fields, str) else type(dedup_fields).__name__))
        for i, field_name in enumerate(dedup_fields):
            check_str(field_name, f"dedup_fields[{i}]")
        request.config.dedup_fields.extend(dedup_fields)
    return request


def exists_differently(err: TopicExists, differences: Sequence[str]) -> TopicExists:
    """The ``TopicExists`` of ``create_topic(exist_ok=True)`` finding the topic with another config:
    the server's code, reason and metadata (``TOPIC_EXISTS``, ``{"topic": name}``), and the differences."""
    return TopicExists(err.code, f"{err.message}, with a different config: {'; '.join(differences)}",
                       reason=err.reason, metadata=err.metadata)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def topic_info(msg: admin_pb2.TopicInfo) -> TopicInfo:
    cfg = msg.config
    retention = Retention(
        **{f: getattr(cfg.retention, f) if cfg.retention.HasField(f) else None for f in _RETENTION_FIELDS}
    )
    return TopicInfo(
        name=cfg.name,
        partition_count=cfg.partitions or len(msg.partitions),
        retention=retention,
        durability=_enum_name(cfg.durability, DURABILITIES),
        full_policy=_enum_name(cfg.full_policy, FULL_POLICIES),
        incarnation=msg.incarnation,
        created_ms=msg.created_ms,
        partitions=tuple(
            PartitionInfo(p.partition, p.start_offset, p.end_offset, p.records, p.bytes)
            for p in msg.partitions
        ),
        schema_json=cfg.schema_json,
        has_schema=msg.has_schema or bool(cfg.schema_json),
        dedup_fields=tuple(cfg.dedup_fields),
        dedup_window_ms=cfg.dedup_window_ms,
    )


def outgoing(item: OutgoingRecord | Mapping[str, Any] | bytes | str) -> OutgoingRecord:
    """Accept a record as an :class:`OutgoingRecord`, a dict of its fields, or a bare value."""
    if isinstance(item, OutgoingRecord):
        return item
    if isinstance(item, bytes | str):
        return OutgoingRecord(value=item)
    if isinstance(item, Mapping):
        unknown = set(item) - set(_RECORD_FIELDS)
        if unknown or "value" not in item:
            raise invalid_argument(
                f"a record dict needs 'value' and may have {'/'.join(_RECORD_FIELDS[1:])}; got {sorted(item)}"
            )
        return OutgoingRecord(**item)
    raise invalid_argument(f"cannot publish a {type(item).__name__}; use bytes, str, dict or OutgoingRecord")


def check_id(value: object, what: str) -> str:
    """An idempotency key or dedup id: a non-empty str of at most ``ID_CHARS_MAX`` characters."""
    if not isinstance(value, str):
        raise invalid_argument(f"{what} must be a str, got {type(value).__name__}")
    if not value or len(value) > ID_CHARS_MAX:
        raise invalid_argument(f"{what} must have 1 to {ID_CHARS_MAX} characters, got {len(value)}")
    return value


def msg_ids(batch: Sequence[OutgoingRecord], dedup_id: str | None, first_msg_id: int | None) -> list[int]:
    """The ``msg_id`` of each record of a batch (all 0 without a producer session).

    With ``dedup_id``: either ``first_msg_id`` (>= 1; the records get N, N+1, ...) or a ``msg_id``
    on every record, whose absolute values rise by exactly one (1, -2, 3 is valid)."""
    given = [r.msg_id for r in batch]
    if dedup_id is None:
        if first_msg_id is not None or any(m is not None for m in given):
            raise invalid_argument("msg_id and first_msg_id need a dedup_id")
        return [0] * len(batch)
    check_id(dedup_id, "dedup_id")
    if first_msg_id is not None:
        if any(m is not None for m in given):
            raise invalid_argument("give either first_msg_id or a msg_id on every record, not both")
        if not _is_int(first_msg_id) or first_msg_id < 1:
            raise invalid_argument(f"first_msg_id must be an int >= 1, got {first_msg_id!r}")
        in_range(first_msg_id + len(batch) - 1, "the batch's last msg_id (first_msg_id + records - 1)", 1, INT64_MAX)
        return [first_msg_id + i for i in range(len(batch))]
    ids: list[int] = []
    for i, msg_id in enumerate(given):
        if msg_id is None:
            raise invalid_argument(f"record {i} has no msg_id: with a dedup_id give first_msg_id or every msg_id")
        if not _is_int(msg_id) or msg_id == 0:
            raise invalid_argument(f"record {i}: msg_id must be a non-zero int, got {msg_id!r}")
        in_range(msg_id, f"record {i}: msg_id", -INT64_MAX, INT64_MAX)
        if ids and abs(msg_id) != abs(ids[-1]) + 1:
            raise invalid_argument(
                f"record {i}: msg_id {msg_id} breaks the sequence (|msg_id| must rise by one per record; "
                f"expected {abs(ids[-1]) + 1} or {-(abs(ids[-1]) + 1)})"
            )
        ids.append(msg_id)
    return ids


def has_keys(batch: Sequence[OutgoingRecord]) -> bool:
    """True when a record of the batch brings its own idempotency key (the batch is then sent with
    per-record keys, not in one of the client's producer sessions)."""
    return any(r.idempotency_key is not None for r in batch)


def publish_record(record: OutgoingRecord, idempotency_key: str, msg_id: int = 0) -> broker_pb2.PublishRecord:
    """The wire form of one record with the key and producer-session id it is sent with."""
    msg = broker_pb2.PublishRecord(
        value=to_bytes(record.value, "value"),
        op=_enum_value(record.op, OPS, "OP", "op"),
        idempotency_key=idempotency_key,
        msg_id=msg_id,
    )
    if record.key is not None:
        msg.key = to_bytes(record.key, "key")
    if record.partition is not None:
        msg.partition = check_int(record.partition, "partition", 0, UINT32_MAX)
    if not isinstance(record.headers, Mapping):
        raise invalid_argument(f"headers must be a dict of str to str, got {type(record.headers).__name__}")
    for name, text in record.headers.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise invalid_argument("headers must map str to str")
        msg.headers[name] = text
    return msg


# -- the packed publish form (PublishRequest.packed_records; issue 15 item 3; helpers: packing.py) ---

def pack_record(record: OutgoingRecord, idempotency_key: str = "", msg_id: int = 0) -> bytes:
    """One packed record: the bytes of :func:`publish_record`'s message, in field order, built
    directly when the record has no partition, headers, idempotency key or msg_id."""
    if record.partition is not None or record.headers or idempotency_key or msg_id:
        return publish_record(record, idempotency_key, msg_id).SerializeToString()
    op = packing.OP_NUMBERS.get(record.op)
    if op is None:
        raise invalid_argument(f"unknown op {record.op!r}; use one of {', '.join(OPS)}")
    data = b""
    if record.key is not None:
        key = to_bytes(record.key, "key")
        data = packing.KEY_TAG + packing.varint(len(key)) + key
    data += packing.pack_value(to_bytes(record.value, "value"))
    return data + packing.OP_TAG + packing.varint(op) if op else data


@dataclass(frozen=True)
class PublishCall:
    """A ``publish_batch`` ready to send: its request as pieces of bytes (:meth:`data` joins them),
    each record's idempotency key (``None``: no per-record keys), and whether it goes in one of the
    client's producer sessions (which set ``dedup_id`` and ``first_msg_id``) rather than as it is.
    Used by one call at a time (:meth:`data` reuses ``parts``)."""

    header: broker_pb2.PublishRequest  # every field but the records
    parts: list[bytes]  # [header bytes (set by data), then the packed_records elements' pieces]
    count: int
    keys: list[str] | None
    in_session: bool

    @property
    def topic(self) -> str:
        return self.header.topic

    def data(self, dedup_id: str | None = None, first_msg_id: int = 0) -> bytes:
        """The serialized ``PublishRequest``; with ``dedup_id``: as that producer session's range
        from ``first_msg_id``. One copy of the records, whatever the batch."""
        header = self.header
        if dedup_id is not None:
            header = broker_pb2.PublishRequest()
            header.CopyFrom(self.header)
            header.dedup_id, header.first_msg_id = dedup_id, first_msg_id
        self.parts[0] = header.SerializeToString()
        return b"".join(self.parts)


def _bare_values(records: Sequence[Any]) -> bool:
    """Whether every record is a bare value (bytes or str): the checks run once per distinct type."""
    return all(issubclass(kind, bytes | str) for kind in set(map(type, records)))


def publish_request(topic: str, records: Sequence[Any], dedup_id: str | None,
                    first_msg_id: int | None) -> PublishCall | None:
    """The one request builder of the sync and asyncio clients (``None`` for an empty batch): the
    records packed, compact results asked for. Bare values (bytes or str, the common case) are
    packed without an :class:`OutgoingRecord` or a bytes object each. Raises InvalidArgument before
    anything is sent."""
    check_str(topic, "topic")
    records = check_batch(records)
    header = broker_pb2.PublishRequest(topic=topic, dedup_id=dedup_id or "", results=broker_pb2.RESULT_FORM_COMPACT)
    parts = [b""]
    if dedup_id is None and first_msg_id is None and _bare_values(records):
        packing.value_elements(records, parts)
        count, keys = len(records), None
    else:
        batch = [outgoing(r) for r in records]
        ids = msg_ids(batch, dedup_id, first_msg_id)
        # a caller's own producer session (dedup_id) is deduplicated by its watermark: its records get
        # no generated key (a key would cost a lookup and a write per record on every node for nothing)
        keys = idempotency_keys(batch) if has_keys(batch) else None
        sent = keys or [""] * len(batch)
        packing.record_elements([pack_record(r, k, m) for r, k, m in zip(batch, sent, ids, strict=True)], parts)
        count = len(batch)
    if not count:
        return None
    if count > PUBLISH_BATCH_RECORDS_MAX:
        raise invalid_argument(f"a batch holds at most {PUBLISH_BATCH_RECORDS_MAX} records, got {count}")
    return PublishCall(header, parts, count, keys, in_session=dedup_id is None and keys is None)


def idempotency_keys(batch: Sequence[OutgoingRecord]) -> list[str]:
    """One key per record (SPEC §4): the caller's, else a random uuid4 hex. Chosen once per
    call, before the first attempt, so every retry resends the same keys."""
    return [
        uuid.uuid4().hex
        if r.idempotency_key is None
        else check_id(r.idempotency_key, f"record {i}: idempotency_key")
        for i, r in enumerate(batch)
    ]


def config_differences(wanted: admin_pb2.TopicConfig, existing: TopicInfo) -> list[str]:
    """How ``existing`` differs from the create request ``wanted`` (fields left unset in ``wanted``,
    and retention, are not compared); empty when it is the topic the request would have made."""
    found = topic_info(admin_pb2.TopicInfo(config=wanted))
    pairs: list[tuple[str, object, object, object]] = [
        ("partitions", True, found.partition_count, existing.partition_count)]
    if wanted.durability:
        pairs.append(("durability", True, found.durability, existing.durability))
    if wanted.full_policy:
        pairs.append(("full_policy", True, found.full_policy, existing.full_policy))
    if wanted.dedup_window_ms:
        pairs.append(("dedup_window_ms", True, found.dedup_window_ms, existing.dedup_window_ms))
    if wanted.schema_json:
        pairs.append(("schema", True, json.loads(wanted.schema_json),
                      json.loads(existing.schema_json) if existing.schema_json else None))
    if wanted.dedup_fields:
        pairs.append(("dedup_fields", True, found.dedup_fields, existing.dedup_fields))
    return [f"{name} is {have!r}, not {want!r}" for name, given, want, have in pairs if given and want != have]


publish_results = packing.publish_results  # the SDKs' reading of either answer form


def publish_result(msg: broker_pb2.PublishResult, idempotency_key: str = "") -> PublishResult:
    return PublishResult(msg.partition, msg.offset, msg.duplicate, msg.timestamp_ms, idempotency_key)


WATERMARKS_PAGE = 1000  # watermarks per GetWatermarks page the SDKs ask for (256-character ids: ~270 KB)


def watermark(msg: admin_pb2.Watermark) -> Watermark:
    return Watermark(dedup_id=msg.dedup_id, msg_id=msg.msg_id)


def is_latest(position: common_pb2.Position) -> bool:
    return position.WhichOneof("kind") == "start" and position.start == common_pb2.START_POSITION_LATEST


def latest_ends(info: TopicInfo) -> dict[int, int] | None:
    """Where "latest" is for each partition of a topic as described: the subscription reopens there,
    not at a "latest" resolved again, which skipped what was committed while its stream was down
    (nothing said it). None for an ``ephemeral`` topic: its offsets change with the leader, and a
    reader behind gets GAP anyway."""
    if info.durability == "ephemeral":
        return None
    return {p.partition: p.end_offset for p in info.partitions}


def position(start: Start, timestamp_ms: int | None) -> common_pb2.Position:
    """The ``Position`` for ``start`` ("earliest", "latest", an offset, a token) or a timestamp."""
    if timestamp_ms is not None:
        if start not in ("earliest", None):
            raise invalid_argument("give either start or timestamp_ms, not both")
        return common_pb2.Position(timestamp_ms=in_range(int(timestamp_ms), "timestamp_ms", -INT64_MAX - 1, INT64_MAX))
    if start == "earliest":
        return common_pb2.Position(start=common_pb2.START_POSITION_EARLIEST)
    if start == "latest":
        return common_pb2.Position(start=common_pb2.START_POSITION_LATEST)
    if isinstance(start, bytes):
        return common_pb2.Position(token=start)
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return common_pb2.Position(offset=in_range(start, "start (an offset)", 0, UINT64_MAX))
    raise invalid_argument(f"start must be 'earliest', 'latest', an offset >= 0 or a token; got {start!r}")


_new_object = object.__new__
_set_attribute = object.__setattr__


def record(msg: common_pb2.Record) -> Record:
    """The delivered record of ``msg``: the SDK's per-record hot path (a consumer's every record).

    Made as ``Record(...)`` makes it, without the frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field): its fields go into the new object's ``__dict__`` at once,
    2.6x faster in all (measured, bench/NOTE.md). ``Record`` has no ``__post_init__`` and no slots
    for this to skip; ``tests/client/test_wire.py`` pins both and the equality."""
    op = msg.op
    out = _new_object(Record)
    _set_attribute(out, "__dict__", {
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        "key": msg.key if msg.HasField("key") else None,
        "value": msg.value,
        "headers": dict(msg.headers) if msg.headers else {},
        "timestamp_ms": msg.timestamp_ms,
        "position": msg.position,
        "producer": msg.producer,
        "op": OPS[op] if 0 <= op < len(OPS) else f"unknown({op})",
        "origin": msg.origin,
        "msg_id": msg.msg_id,
    })
    return out


def check_read_options(max_batch: int, partition: int | None) -> None:
    """Raises :class:`InvalidArgument` for a negative ``max_batch`` or ``partition``."""
    in_range(max_batch, "max_batch", 0, UINT32_MAX)
    if partition is not None:
        in_range(partition, "partition", 0, UINT32_MAX)


def compact_batch(msg: broker_pb2.CompactBatch) -> Batch:
    """The :class:`Batch` of a compact response: the SDK's per-record work is one attribute read
    of each record's value (the parse was one C call for the whole response)."""
    records = msg.records
    stamps: list[int] = []
    for count, ts in zip(msg.timestamp_counts, msg.timestamps_ms, strict=True):
        stamps += [ts] * count
    if len(stamps) != len(records):
        raise BrokerError("INTERNAL", f"a compact batch of {len(records)} records gave {len(stamps)} timestamps")
    return Batch(topic=msg.topic, partition=msg.partition, first_offset=msg.first_offset,
                 values=[r.value for r in records], timestamps_ms=stamps, next_position=msg.next_position,
                 _messages=records)


def records_batch(msg: broker_pb2.RecordBatch) -> Batch:
    """A :class:`Batch` of a response of whole records (what a compact read falls back to around an
    unreadable record): consecutive offsets of one partition, as the server sends them."""
    records = msg.records
    first, last = records[0], records[-1]
    if last.offset - first.offset != len(records) - 1:
        raise BrokerError("INTERNAL", f"records {first.offset}..{last.offset} of one response are not consecutive")
    return Batch(topic=first.topic, partition=first.partition, first_offset=first.offset,
                 values=[r.value for r in records], timestamps_ms=[r.timestamp_ms for r in records],
                 next_position=last.position, _messages=records)


def event(msg: common_pb2.Event) -> Event:
    return Event(
        type=_enum_name(msg.type, EVENT_TYPES),
        topic=msg.topic,
        partition=msg.partition,
        offset_before=msg.offset_before,
        offset_after=msg.offset_after,
        position_before=msg.position_before,
        position_after=msg.position_after,
        detail=msg.detail,
    )


def node_info(n: admin_pb2.NodeInfo) -> NodeInfo:
    return NodeInfo(
        id=n.id,
        grpc_address=n.grpc_address,
        role=n.role,
        term=n.term,
        commit_index=n.commit_index,
        applied_index=n.applied_index,
        pid=n.pid,
        reachable=n.reachable,
        leader_id=n.leader_id,
        raft_address=n.raft_address,
        metrics_address=n.metrics_address,
        apply_format=n.apply_format,
        cluster_format=n.cluster_format,
    )


def replica_verification(msg: admin_pb2.VerifyReplicasResponse) -> ReplicaVerification:
    return ReplicaVerification(
        index=msg.index,
        nodes=tuple(NodeDigest(id=n.id, reachable=n.reachable, digest=None if n.error or not n.reachable else n.digest,
                               error=n.error) for n in msg.nodes),
        differing=tuple(msg.differing), agreed=msg.agreed)


def cluster_status(msg: admin_pb2.ClusterStatusResponse) -> ClusterStatus:
    return ClusterStatus(leader_id=msg.leader_id, nodes=tuple(node_info(n) for n in msg.nodes))
