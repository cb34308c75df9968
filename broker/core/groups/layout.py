"""The key layout of ``Column.GROUPS`` and typed reads of it.

| key | value |
|---|---|
| ``n`` | ``>I`` next group id (ids are never reused) |
| ``m`` + topic + ``0x00`` + group | ``GroupMeta`` |
| ``g`` + ``>I`` gid + ``c`` + ``>I`` partition | ``GroupCursor`` (watermark, acked ranges, counts) |
| ``g`` + ``>I`` gid + ``r`` + ``>I`` partition + ``>Q`` offset | ``RetryState`` |
| ``g`` + ``>I`` gid + ``d`` + ``>I`` partition + ``>Q`` offset | ``DeadLetterState`` |

Everything of one group id lies in ``[g + gid, g + gid+1)``, so deleting a group is one range
delete. Groups are keyed by topic *name*: they outlive a drop of their topic, and when the topic is
re-created they follow the new incarnation under a new group id (reporting ``RESET``).
Writes happen only in :mod:`broker.core.groups.apply`; reads are safe from any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from broker.core.groups.cursor import GroupCursor
from broker.storage import Batch, Column, Store
from broker.v1 import internal_pb2

NEXT_ID = b"n"
_U32 = struct.Struct(">I")
_POS = struct.Struct(">IQ")


def meta_key(topic: str, group: str) -> bytes:
    return b"m" + topic.encode() + b"\x00" + group.encode()


def _topic_prefix(topic: str) -> bytes:
    return b"m" + topic.encode() + b"\x00"


def _gid(gid: int) -> bytes:
    return b"g" + _U32.pack(gid)


def group_range(gid: int) -> tuple[bytes, bytes]:
    return _gid(gid), _gid(gid + 1)


def cursor_key(gid: int, partition: int) -> bytes:
    return _gid(gid) + b"c" + _U32.pack(partition)


def retry_key(gid: int, partition: int, offset: int) -> bytes:
    return _gid(gid) + b"r" + _POS.pack(partition, offset)


def dead_key(gid: int, partition: int, offset: int) -> bytes:
    return _gid(gid) + b"d" + _POS.pack(partition, offset)


def retry_range(gid: int, partition: int | None = None) -> tuple[bytes, bytes]:
    """Retry keys of one partition, or of the whole group."""
    if partition is None:
        return _gid(gid) + b"r", _gid(gid) + b"s"
    return _gid(gid) + b"r" + _U32.pack(partition), _gid(gid) + b"r" + _U32.pack(partition + 1)


def dead_range(gid: int, partition: int | None = None) -> tuple[bytes, bytes]:
    """Dead-letter keys of one partition, or of the whole group."""
    if partition is None:
        return _gid(gid) + b"d", _gid(gid) + b"e"
    return _gid(gid) + b"d" + _U32.pack(partition), _gid(gid) + b"d" + _U32.pack(partition + 1)


def position_of(key: bytes) -> tuple[int, int]:
    """(partition, offset) of a retry or dead-letter key."""
    partition, offset = _POS.unpack(key[6:])
    return int(partition), int(offset)


# -- reads ---------------------------------------------------------------------------------------
def next_group_id(store: Store) -> int:
    raw = store.get(Column.GROUPS, NEXT_ID)
    return _U32.unpack(raw)[0] if raw else 1


def set_next_group_id(batch: Batch, value: int) -> None:
    batch.put(Column.GROUPS, NEXT_ID, _U32.pack(value))


def get_meta(store: Store, topic: str, group: str) -> internal_pb2.GroupMeta | None:
    raw = store.get(Column.GROUPS, meta_key(topic, group))
    return internal_pb2.GroupMeta.FromString(raw) if raw is not None else None


def topic_metas(store: Store, topic: str) -> list[internal_pb2.GroupMeta]:
    """Every group of ``topic``, sorted by name."""
    prefix = _topic_prefix(topic)
    end = prefix[:-1] + b"\x01"
    return [internal_pb2.GroupMeta.FromString(v) for _, v in store.scan(Column.GROUPS, prefix, end)]


def all_metas(store: Store) -> list[internal_pb2.GroupMeta]:
    """Every group of every topic, sorted by topic then group."""
    return [internal_pb2.GroupMeta.FromString(v) for _, v in store.scan(Column.GROUPS, b"m", b"n")]


def get_cursor(store: Store, gid: int, partition: int) -> GroupCursor:
    return GroupCursor.decode(store.get(Column.GROUPS, cursor_key(gid, partition)))


def get_cursors(store: Store, gid: int, partitions: int) -> list[GroupCursor]:
    raws = store.get_many(Column.GROUPS, [cursor_key(gid, p) for p in range(partitions)])
    return [GroupCursor.decode(raw) for raw in raws]


def retries(store: Store, gid: int, partition: int | None = None) -> Iterator[tuple[int, int, internal_pb2.RetryState]]:
    """(partition, offset, state) of the records waiting for a retry, in (partition, offset) order."""
    begin, end = retry_range(gid, partition)
    for key, value in store.scan(Column.GROUPS, begin, end):
        yield (*position_of(key), internal_pb2.RetryState.FromString(value))


def retries_at(store: Store, gid: int, positions: list[tuple[int, int]]) -> list[internal_pb2.RetryState | None]:
    """The retry entries of ``positions`` (None where a position has none), in one multi-get."""
    raws = store.get_many(Column.GROUPS, [retry_key(gid, p, o) for p, o in positions])
    return [internal_pb2.RetryState.FromString(raw) if raw is not None else None for raw in raws]


def dead_letters(store: Store, gid: int, partition: int | None = None, after_offset: int | None = None,
                 limit: int | None = None) -> Iterator[tuple[int, int, internal_pb2.DeadLetterState]]:
    """(partition, offset, state) of the group's dead letters in (partition, offset) order."""
    begin, end = dead_range(gid, partition)
    if partition is not None and after_offset is not None:
        begin = dead_key(gid, partition, after_offset + 1)
    for key, value in store.scan(Column.GROUPS, begin, end, limit):
        yield (*position_of(key), internal_pb2.DeadLetterState.FromString(value))
