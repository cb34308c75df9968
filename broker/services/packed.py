"""The packed publish form (``PublishRequest.packed_records``) and the compact response (issue 15
item 3): a publish without a Python object per record on the leader's hot path.

A packed record is one serialized ``PublishRecord``; its bytes are also a valid ``RecordBody``
(fields 4-9 are shared, ``tests/core/test_internal_wire.py`` pins it) as long as it carries nothing
else. So the leader stores a packed record's bytes as they came, once it knows that every record
of the request holds only ``value`` and ``op`` (or ``key``, ``value`` and ``op``). Two parses in C
prove it for the whole request, with nothing serialized again:

one parse in C proves it for the whole request, with nothing serialized again or joined: the
request's bytes as received parse as a view (``publish_view.proto``'s ``LeanRequest``) whose
``packed_records`` is ONE ``LeanFields``, a singular message field, so its occurrences merge:

1. each packed record is parsed as a message within its own length, so every record is well formed
   on its own (no field runs past its end);
2. the merged ``LeanFields`` has no unknown field: a proto2 message of only those fields, ``op`` a
   closed enum, so any other field number, any other wire type and any op outside the enum in any
   record lands in its unknown fields. The same parse collects every key (whether any record has
   one).

Until 2026-12-05 the check was two parses and a join: the request as a view of one message per
record, then every record joined (a 1 MiB copy at 1 KiB records) parsed as one ``LeanFields``.
The view of one message per record (``KeyedRequest``) is still parsed when a record has a key (the
keys per record: a record may repeat its key field, so the merged keys need not align) or when the
values are read (topics with a schema or dedup fields).

Repeated or unusually encoded allowed fields pass, and are stored as they came: a reader parses
them as the check did. Anything else (headers, an explicit partition, an idempotency key, a
msg_id, a field a client may not set such as ``producer`` or ``origin``, an op outside the enum,
bytes that do not parse) takes the per-record path: each record parsed on its own, unknown fields
dropped, and handled exactly as the repeated ``records`` form. So every refusal is today's, plus
one for a record that does not parse, which names its index.
"""

from __future__ import annotations

import operator
from collections import Counter

from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from broker.core.errors import InvalidArgument
from broker.leader.publishing import PublishBatch, Published, PublishItem
from broker.v1 import broker_pb2, publish_view_pb2

_DUPLICATE = operator.itemgetter(3)


def _lean_fields(data: bytes) -> publish_view_pb2.LeanFields | None:
    """The fields of every packed record together when each record is well formed on its own and
    holds only ``key``, ``value`` and ``op``; None for the per-record path."""
    try:
        fields = publish_view_pb2.LeanRequest.FromString(data).packed_records
    except DecodeError:
        return None
    return None if UnknownFieldSet(fields) else fields


def _per_record(data: bytes) -> publish_view_pb2.KeyedRequest:
    """The request as a view of one message per packed record (its key and value as a reader takes them)."""
    return publish_view_pb2.KeyedRequest.FromString(data)


def packed_batch(request: broker_pb2.PublishRequest, data: bytes | None = None) -> PublishBatch:
    """A request in the packed form as a :class:`PublishBatch`; the request is left as it was.
    ``data``: the request's bytes as received (else it is serialized again, which costs ~2 us per
    1 KiB record)."""
    if request.records:
        raise InvalidArgument("give either records or packed_records, not both")
    bodies = list(request.packed_records)
    raw = request.SerializeToString() if data is None else data
    fields = _lean_fields(raw)
    if fields is None:
        return PublishBatch(topic=request.topic, records=_items(bodies), dedup_id=request.dedup_id,
                            first_msg_id=request.first_msg_id)
    # per record from a view of each: a record may repeat its key field, so the merged keys need not align
    keys = [r.key if r.HasField("key") else None for r in _per_record(raw).packed_records] if fields.key else None
    return PublishBatch(topic=request.topic, bodies=bodies, dedup_id=request.dedup_id,
                        first_msg_id=request.first_msg_id, keys=keys,
                        values=lambda: (r.value for r in _per_record(raw).packed_records))


def _items(bodies: list[bytes]) -> list[PublishItem]:
    """Each packed record parsed on its own (the per-record path: ``wire.publish_batch``'s loop)."""
    items = []
    for i, data in enumerate(bodies):
        try:
            r = broker_pb2.PublishRecord.FromString(data)
        except DecodeError:
            raise InvalidArgument(f"packed record {i} ({len(data)} bytes) is not a PublishRecord") from None
        r.DiscardUnknownFields()  # body fields a client may not set (a forged producer, origin, ...)
        partition = r.partition if r.HasField("partition") else None
        key = r.key if r.HasField("key") else None
        idempotency_key, msg_id = r.idempotency_key, r.msg_id
        r.ClearField("partition")
        r.ClearField("idempotency_key")
        r.ClearField("msg_id")
        items.append(PublishItem(r.SerializeToString(), r.value, key, r.op, partition, idempotency_key, msg_id))
    return items


def compact_ranges(published: Published) -> list[broker_pb2.PartitionRange] | None:
    """One range per partition touched, or None when the batch holds a duplicate (or, against the
    apply's contract, a partition's places are not consecutive with one timestamp).

    The common batch comes from the apply as runs (``Appended.ranges``), taken as they are. Else
    O(partitions) checks over per-record lists built in C: the first and last record of each
    partition must be ``count - 1`` offsets apart with the same timestamp, which with offsets that
    rise and timestamps that never fall within a partition means consecutive offsets, one time."""
    runs = published.placed.ranges()
    if runs is not None:  # the common batch: the apply's runs as they are, nothing per record
        return [broker_pb2.PartitionRange(partition=p, base_offset=first, count=count, timestamp_ms=ts)
                for p, first, count, ts in runs]
    placements = published.placements
    if any(map(_DUPLICATE, placements)):  # in C, like every per-record pass below
        return None
    partitions = published.partitions
    n = len(partitions)
    if n and partitions.count(partitions[0]) == n:  # one partition (every publish to a 1-partition topic)
        one = _range(partitions[0], n, placements[0], placements[-1])
        return None if one is None else [one]
    first = dict(zip(reversed(partitions), range(n - 1, -1, -1), strict=True))  # the earliest index wins
    last = dict(zip(partitions, range(n), strict=True))
    counts = Counter(partitions)
    ranges = []
    for partition, i in sorted(first.items(), key=operator.itemgetter(1)):
        found = _range(partition, counts[partition], placements[i], placements[last[partition]])
        if found is None:
            return None
        ranges.append(found)
    return ranges


def _range(partition: int, count: int, first: tuple[int, int, int, bool],
           last: tuple[int, int, int, bool]) -> broker_pb2.PartitionRange | None:
    """The range of ``count`` records of ``partition`` from the placements of its first and last
    record, or None unless they are ``count - 1`` offsets apart with one timestamp."""
    _, base, ts, _ = first
    _, end, end_ts, _ = last
    if end - base != count - 1 or end_ts != ts:
        return None
    return broker_pb2.PartitionRange(partition=partition, base_offset=base, count=count, timestamp_ms=ts)


def compact_response(published: Published) -> broker_pb2.PublishResponse | None:
    """The ``RESULT_FORM_COMPACT`` answer, or None when it must be one result per record."""
    ranges = compact_ranges(published)
    if ranges is None:
        return None
    response = broker_pb2.PublishResponse(ranges=ranges)
    response.partitions.extend(published.partitions)
    return response

