"""Deduplication state inside the state machine (SPEC §4): idempotency keys and watermarks.

Layout in ``Column.DEDUP`` (topic id first, so dropping a topic range-deletes all of it):
``>I tid + b"k" + key`` -> ``>IQq`` (partition, offset, timestamp_ms) of the first copy;
``>I tid + b"t" + >q timestamp_ms + key`` -> ``b""`` (expiry index, ordered by time);
``>I tid + b"w" + dedup_id`` -> ``>q`` high watermark of ``|msg_id|``.
Everything here runs inside ``apply`` and depends only on the command and the store.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from broker.storage import Batch, Column, Store

_TID = struct.Struct(">I")
_PLACE = struct.Struct(">IQq")
_TS = struct.Struct(">q")
FOREVER = -1


def _key(tid: int, key: str) -> bytes:
    return _TID.pack(tid) + b"k" + key.encode()


def _expiry_key(tid: int, ts: int, key: str) -> bytes:
    return _TID.pack(tid) + b"t" + _TS.pack(ts) + key.encode()


def _watermark_key(tid: int, dedup_id: str) -> bytes:
    return _TID.pack(tid) + b"w" + dedup_id.encode()


def topic_range(tid: int) -> tuple[bytes, bytes]:
    return _TID.pack(tid), _TID.pack(tid + 1)


def lookup_keys(store: Store, tid: int, keys: list[str]) -> dict[str, bytes]:
    """The stored entries of those ``keys`` that have one (one multi-get)."""
    wanted = sorted({k for k in keys if k})
    found = store.get_many(Column.DEDUP, [_key(tid, k) for k in wanted])
    return {k: raw for k, raw in zip(wanted, found, strict=True) if raw is not None}


def live_place(raw: bytes | None, now_ms: int, window_ms: int) -> tuple[int, int, int] | None:
    """(partition, offset, timestamp) of a stored entry still inside the window."""
    if raw is None:
        return None
    partition, offset, ts = _PLACE.unpack(raw)
    if window_ms != FOREVER and now_ms - ts > window_ms:
        return None
    return partition, offset, ts


def remember_key(batch: Batch, tid: int, key: str, place: tuple[int, int, int], old: bytes | None) -> None:
    """Record ``key`` -> ``place``, replacing an expired entry ``old`` (and its expiry index entry)."""
    if old is not None:
        batch.delete(Column.DEDUP, _expiry_key(tid, _PLACE.unpack(old)[2], key))
    batch.put(Column.DEDUP, _key(tid, key), _PLACE.pack(*place))
    batch.put(Column.DEDUP, _expiry_key(tid, place[2], key), b"")


def expire_keys(batch: Batch, store: Store, tid: int, older_than_ms: int) -> int:
    """Forget keys first seen before ``older_than_ms``; returns how many."""
    prefix = _TID.pack(tid) + b"t"
    count = 0
    for index_key, _ in store.scan(Column.DEDUP, prefix, prefix + _TS.pack(older_than_ms)):
        key = index_key[len(prefix) + _TS.size:].decode()
        batch.delete(Column.DEDUP, index_key)
        batch.delete(Column.DEDUP, _key(tid, key))
        count += 1
    return count


def watermark(store: Store, tid: int, dedup_id: str) -> int:
    raw = store.get(Column.DEDUP, _watermark_key(tid, dedup_id))
    return _TS.unpack(raw)[0] if raw else 0


def set_watermark(batch: Batch, tid: int, dedup_id: str, value: int) -> None:
    batch.put(Column.DEDUP, _watermark_key(tid, dedup_id), _TS.pack(value))


def reset_watermark(batch: Batch, tid: int, dedup_id: str) -> None:
    batch.delete(Column.DEDUP, _watermark_key(tid, dedup_id))


def watermarks(store: Store, tid: int) -> Iterator[tuple[str, int]]:
    prefix = _TID.pack(tid) + b"w"
    for key, value in store.scan(Column.DEDUP, prefix, _TID.pack(tid) + b"x"):
        yield key[len(prefix):].decode(), _TS.unpack(value)[0]


def _unique_key(tid: int, key: str) -> bytes:
    return _TID.pack(tid) + b"u" + key.encode()


def existing_unique_keys(store: Store, tid: int, keys: list[str]) -> set[str]:
    """Which of ``keys`` (dedup-field keys) are already taken (one multi-get)."""
    wanted = sorted(set(keys))
    found = store.get_many(Column.DEDUP, [_unique_key(tid, k) for k in wanted])
    return {k for k, raw in zip(wanted, found, strict=True) if raw is not None}


def take_unique_key(batch: Batch, tid: int, key: str) -> None:
    batch.put(Column.DEDUP, _unique_key(tid, key), b"")
