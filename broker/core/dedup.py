"""Deduplication state inside the state machine (SPEC §4): idempotency keys and watermarks.

Layout in ``Column.DEDUP`` (topic id first, so dropping a topic range-deletes all of it):
``>I tid + b"k" + >Q bucket + key`` -> ``>IQq`` (partition, offset, timestamp_ms) of the first copy,
where ``bucket = now_ms // window_ms`` when the key was stored (0 for ``forever``): a lookup reads
the current and the previous bucket (one multi-get), and expiry is one range delete of older
buckets, so a keyed record costs one write and expiry costs no scan;
``>I tid + b"w" + dedup_id`` -> ``>q`` high watermark of ``|msg_id|`` (a producer session by range
appends its last batch's placement after it: ``broker.core.sessions``);
``>I tid + b"c"`` -> ``>q`` the window clock: the highest ``now_ms`` keys were remembered at.
The window clock makes windows robust to a leader clock that goes back (or a forward jump that is
healed): every lookup, remember and expiry runs at :func:`window_now_ms`, ``max(now_ms, window
clock)``, so a key is always looked for in the bucket it was stored in or the next one, until its
window has passed on the window clock. (The price: after a healed forward jump, keys stay live for
the size of the jump longer: duplicates are refused longer, never accepted early.)
Everything here runs inside ``apply`` and depends only on the command and the store; the checks an
append makes before it writes anything (:func:`check_unique`, :func:`check_watermark`) are here too.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from broker.core.errors import DuplicateMessage, InvalidArgument
from broker.storage import Batch, Column, Store
from broker.v1 import internal_pb2

_TID = struct.Struct(">I")
_PLACE = struct.Struct(">IQq")
_TS = struct.Struct(">q")
FOREVER = -1


_BUCKET = struct.Struct(">Q")


def _bucket(now_ms: int, window_ms: int) -> int:
    return 0 if window_ms == FOREVER else max(now_ms, 0) // window_ms


def _prefix(tid: int, bucket: int) -> bytes:
    return _TID.pack(tid) + b"k" + _BUCKET.pack(bucket)


def _key(tid: int, bucket: int, key: str) -> bytes:
    return _prefix(tid, bucket) + key.encode()


def _window_clock_key(tid: int) -> bytes:
    return _TID.pack(tid) + b"c"


def window_now_ms(store: Store, tid: int, now_ms: int) -> int:
    """The time a lookup, remember or expiry of topic ``tid`` runs at: ``now_ms`` (the command's
    leader time), but never before the latest time keys were remembered at."""
    raw = store.get(Column.DEDUP, _window_clock_key(tid))
    return max(now_ms, _TS.unpack(raw)[0]) if raw else now_ms


def window_clocks(store: Store, tids: list[int]) -> list[int | None]:
    """Each topic's window clock (the latest time keys were remembered at), None for a topic that
    never remembered a key; one multi-get."""
    raws = store.get_many(Column.DEDUP, [_window_clock_key(tid) for tid in tids]) if tids else []
    return [_TS.unpack(raw)[0] if raw else None for raw in raws]


def watermark_key(tid: int, dedup_id: str) -> bytes:
    """Where a ``dedup_id``'s watermark (and its session state, ``broker.core.sessions``) is stored."""
    return _TID.pack(tid) + b"w" + dedup_id.encode()


def topic_range(tid: int) -> tuple[bytes, bytes]:
    return _TID.pack(tid), _TID.pack(tid + 1)


def lookup_keys(store: Store, tid: int, keys: list[str], now_ms: int, window_ms: int) -> dict[str, bytes]:
    """The newest stored entries of those ``keys`` that may still be inside the window."""
    wanted = sorted({k for k in keys if k})
    current = _bucket(now_ms, window_ms)
    buckets = [current] if window_ms == FOREVER or current == 0 else [current, current - 1]
    encoded = [k.encode() for k in wanted]
    found = store.get_many(Column.DEDUP, [prefix + k for prefix in (_prefix(tid, b) for b in buckets) for k in encoded])
    out: dict[str, bytes] = {}
    for i, raw in enumerate(found):
        key = wanted[i % len(wanted)]
        if raw is not None and (key not in out or _PLACE.unpack(raw)[2] > _PLACE.unpack(out[key])[2]):
            out[key] = raw
    return out


def live_place(raw: bytes | None, now_ms: int, window_ms: int) -> tuple[int, int, int] | None:
    """(partition, offset, timestamp) of a stored entry still inside the window."""
    if raw is None:
        return None
    partition, offset, ts = _PLACE.unpack(raw)
    if window_ms != FOREVER and now_ms - ts > window_ms:
        return None
    return partition, offset, ts


def remember_keys(batch: Batch, tid: int, now_ms: int, window_ms: int,
                  places: list[tuple[str, int, int, int]]) -> None:
    """Record each (key, partition, offset, timestamp) in the bucket of ``now_ms`` (a
    :func:`window_now_ms`), which becomes the window clock."""
    prefix = _prefix(tid, _bucket(now_ms, window_ms))
    batch.put(Column.DEDUP, _window_clock_key(tid), _TS.pack(now_ms))
    pack = _PLACE.pack
    for key, partition, offset, ts in places:
        batch.put(Column.DEDUP, prefix + key.encode(), pack(partition, offset, ts))


def expire_keys(batch: Batch, tid: int, now_ms: int, window_ms: int) -> None:
    """Forget keys in buckets that no lookup at ``now_ms`` or later reads (one range delete)."""
    if window_ms == FOREVER:
        return
    oldest_read = _bucket(now_ms, window_ms) - 1
    if oldest_read > 0:
        prefix = _TID.pack(tid) + b"k"
        batch.delete_range(Column.DEDUP, prefix + _BUCKET.pack(0), prefix + _BUCKET.pack(oldest_read))


def watermark(store: Store, tid: int, dedup_id: str) -> int:
    raw = store.get(Column.DEDUP, watermark_key(tid, dedup_id))
    return _TS.unpack_from(raw)[0] if raw else 0  # a session's value carries its last batch after it


def set_watermark(batch: Batch, tid: int, dedup_id: str, value: int) -> None:
    batch.put(Column.DEDUP, watermark_key(tid, dedup_id), _TS.pack(value))


def reset_watermark(batch: Batch, tid: int, dedup_id: str) -> None:
    batch.delete(Column.DEDUP, watermark_key(tid, dedup_id))


def watermarks_range(tid: int) -> tuple[bytes, bytes]:
    """The keys of topic ``tid``'s watermarks (and sessions): ``[begin, end)``."""
    return _TID.pack(tid) + b"w", _TID.pack(tid) + b"x"


def watermarks(store: Store, tid: int, after: str = "", limit: int | None = None) -> Iterator[tuple[str, int]]:
    """``(dedup_id, watermark)`` in dedup_id order (of its UTF-8 bytes), after ``after``, at most ``limit``."""
    prefix, end = watermarks_range(tid)
    begin = prefix + after.encode() + b"\x00" if after else prefix
    for key, value in store.scan(Column.DEDUP, begin, end, limit):
        yield key[len(prefix):].decode(), _TS.unpack_from(value)[0]


def _unique_key(tid: int, key: str) -> bytes:
    return _TID.pack(tid) + b"u" + key.encode()


def existing_unique_keys(store: Store, tid: int, keys: list[str]) -> set[str]:
    """Which of ``keys`` (dedup-field keys) are already taken (one multi-get)."""
    wanted = sorted(set(keys))
    found = store.get_many(Column.DEDUP, [_unique_key(tid, k) for k in wanted])
    return {k for k, raw in zip(wanted, found, strict=True) if raw is not None}


def take_unique_key(batch: Batch, tid: int, key: str) -> None:
    batch.put(Column.DEDUP, _unique_key(tid, key), b"")


# -- the checks of an append (state machine, phase 1: nothing is written here) ------------------
def check_unique(store: Store, cmd: internal_pb2.AppendCommand, tid: int, meta: internal_pb2.TopicMeta,
                 indexes: list[int]) -> DuplicateMessage | None:
    """Dedup fields: the error refusing the whole batch if a record to store (``indexes`` into the
    command) repeats a taken key, else None."""
    if not cmd.unique_keys:
        return None
    keys = [cmd.unique_keys[i] for i in indexes]
    taken = existing_unique_keys(store, tid, keys)
    seen: set[str] = set()
    for i, key in zip(indexes, keys, strict=True):
        if key in taken or key in seen:
            fields = ", ".join(meta.config.dedup_fields)
            return DuplicateMessage(
                f"record {i}: a record with the same dedup fields ({fields}) = {key} already exists")
        seen.add(key)
    return None


def check_watermark(store: Store, cmd: internal_pb2.AppendCommand, tid: int
                    ) -> tuple[list[bool], int] | InvalidArgument:
    """Which records are new for their producer session, and the watermark to write once the
    batch is stored (0: unchanged); or the error refusing the whole batch when an id breaks the rule that
    ``|msg_id|`` rises by one per message. Nothing is written here: a batch refused later
    (dedup fields, a full topic) must not move the watermark."""
    if not cmd.dedup_id:
        return [True] * len(cmd.bodies), 0
    mark = start = watermark(store, tid, cmd.dedup_id)
    fresh: list[bool] = []
    for i, msg_id in enumerate(cmd.msg_ids):
        size = abs(msg_id)
        if size <= mark:
            fresh.append(False)
        elif size == mark + 1:
            fresh.append(True)
            mark = size
        else:
            return InvalidArgument(
                f"record {i}: msg_id {msg_id} breaks the sequence of dedup_id {cmd.dedup_id!r} "
                f"(its watermark is {mark}: the next id must be {mark + 1} or {-(mark + 1)})")
    return fresh, (mark if mark != start else 0)

