"""Producer sessions by range (SPEC §4): one check and one write per batch, not per record.

A session batch is ``(dedup_id, first_msg_id, count)``: its records are the session's messages
``first .. first + count - 1`` and carry no id of their own. The session's state is one value in
``Column.DEDUP`` under the same key as a per-record watermark (``dedup.watermark_key``), so both
forms share one watermark per ``dedup_id``:

``>q mark`` (the highest message id stored), then optionally the placement of the session's last
stored batch, so a retry of that batch (the only one a client using the session one call at a time
can have in flight) answers with the original places like an idempotency key does:
``>qI first, count`` (its stored messages), ``>BH width, parts`` (bytes per partition number: 0 when
every record went to one partition, else 1, 2 or 4; how many partitions it touched), ``parts`` x
``>IQq`` (partition, first offset in it, timestamp) and, unless ``width`` is 0, ``count`` partition
numbers of ``width`` bytes big-endian, in message order. A value of 8 bytes (a per-record
watermark, or data written before sessions by range existed) is a watermark with no placement:
older data directories read unchanged.

Rules of :func:`check` (the state machine's apply): a batch starting past ``mark + 1`` is refused
(:class:`SessionOutOfSequence`, nothing stored); messages at or below ``mark`` are duplicates
(answered with their place when they belong to the remembered batch, else with offset 0, like a
per-record watermark); the rest are stored and the watermark moves to the batch's last id.
Everything here depends only on the command and the store, and never raises for a stored value it
wrote itself (a malformed one is treated as a bare watermark).

Expiry (:func:`expire`, run by the leader's dedup housekeeping): a session by range whose last batch
is older than the topic's dedup window is forgotten, as an idempotency key is, so the sessions of
short-lived clients do not pile up. A client that comes back later gets ``SESSION_OUT_OF_SEQUENCE``
for its next batch (nothing stored; the SDK opens a new session); a retry later than the window
would be stored again, the same bound as for keys (the SDK's retry deadline is far below it).
Per-record watermarks (8-byte values) and topics whose window is ``forever`` never expire, and the
leader refuses a batch by range for a ``dedup_id`` that has one (:func:`check_form`): the two forms
may follow each other on one ``dedup_id`` only from a session by range to per-record ids.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from broker.core import dedup
from broker.core.errors import InvalidArgument, SessionOutOfSequence
from broker.storage import Batch, Column, Store

MSG_ID_MAX = 2**63 - 1  # message ids are int64
_MARK = struct.Struct(">q")
_HEAD = struct.Struct(">qIBH")
_PART = struct.Struct(">IQq")
_WIDTHS = {1: "B", 2: "H", 4: "I"}


@dataclass(frozen=True, slots=True)
class LastBatch:
    """Where the session's last stored batch went: messages ``first .. first + count - 1``."""

    first: int
    count: int
    starts: dict[int, tuple[int, int]]  # partition -> (first offset, timestamp_ms)
    partitions: Sequence[int]  # per message, in order (empty: all in the one partition of starts)

    def places(self, first: int, count: int) -> list[tuple[int, int, int]] | None:
        """(partition, offset, timestamp_ms) of messages ``first .. first + count - 1`` when they all
        lie inside this batch, else None."""
        if first < self.first or first + count > self.first + self.count:
            return None
        skip = first - self.first
        if not self.partitions:
            (partition, (offset, ts)), = self.starts.items()
            return [(partition, offset + skip + i, ts) for i in range(count)]
        next_offset = {p: start for p, (start, _ts) in self.starts.items()}
        out: list[tuple[int, int, int]] = []
        for i, partition in enumerate(self.partitions[:skip + count]):
            offset = next_offset[partition]
            next_offset[partition] = offset + 1
            if i >= skip:
                out.append((partition, offset, self.starts[partition][1]))
        return out


@dataclass(frozen=True, slots=True)
class SessionState:
    mark: int
    last: LastBatch | None


def load(store: Store, tid: int, dedup_id: str) -> SessionState:
    """The session's watermark and last batch (watermark 0 and none for an unknown session)."""
    raw = store.get(Column.DEDUP, dedup.watermark_key(tid, dedup_id))
    return decode(raw) if raw else SessionState(0, None)


def decode(raw: bytes) -> SessionState:
    mark = _MARK.unpack_from(raw)[0]
    if len(raw) < _MARK.size + _HEAD.size:
        return SessionState(mark, None)
    first, count, width, parts = _HEAD.unpack_from(raw, _MARK.size)
    pos = _MARK.size + _HEAD.size
    need = pos + parts * _PART.size + (count * width if width else 0)
    if len(raw) != need or (width and width not in _WIDTHS) or (not width and parts != 1):
        return SessionState(mark, None)  # not a layout this module writes: a bare watermark
    starts: dict[int, tuple[int, int]] = {}
    for _ in range(parts):
        partition, offset, ts = _PART.unpack_from(raw, pos)
        starts[partition] = (offset, ts)
        pos += _PART.size
    partitions: Sequence[int] = ()
    if width:
        partitions = struct.unpack_from(f">{count}{_WIDTHS[width]}", raw, pos)
        if not set(partitions) <= starts.keys():
            return SessionState(mark, None)
    return SessionState(mark, LastBatch(first, count, starts, partitions))


def encode(mark: int, first: int, partitions: Sequence[int], starts: dict[int, tuple[int, int]]) -> bytes:
    """The stored value after a batch stored messages ``first ..`` in ``partitions`` (in order)."""
    count = len(partitions)
    top = max(starts)
    width = 0 if len(starts) == 1 else 1 if top < 2**8 else 2 if top < 2**16 else 4
    out = [_MARK.pack(mark), _HEAD.pack(first, count, width, len(starts))]
    out.extend(_PART.pack(p, offset, ts) for p, (offset, ts) in sorted(starts.items()))
    if width:
        out.append(struct.pack(f">{count}{_WIDTHS[width]}", *partitions))
    return b"".join(out)


def last_used_ms(raw: bytes) -> int | None:
    """The newest timestamp of the last batch in a stored value (None: a bare watermark). Reads
    only the head and the per-partition starts, not the per-record partitions (expiry scans every
    session of every topic)."""
    if len(raw) < _MARK.size + _HEAD.size:
        return None
    _first, _count, _width, parts = _HEAD.unpack_from(raw, _MARK.size)
    pos = _MARK.size + _HEAD.size
    if not parts or len(raw) < pos + parts * _PART.size:
        return None
    return max(_PART.unpack_from(raw, pos + i * _PART.size)[2] for i in range(parts))


def expire(store: Store, batch: Batch, tid: int, now_ms: int, window_ms: int) -> int:
    """Forget topic ``tid``'s sessions by range idle for longer than ``window_ms`` at ``now_ms``
    (a scan of its watermarks); returns how many."""
    if window_ms == dedup.FOREVER:
        return 0
    begin, end = dedup.watermarks_range(tid)
    forgotten = 0
    for key, raw in store.scan(Column.DEDUP, begin, end):
        used = last_used_ms(raw)
        if used is not None and now_ms - used > window_ms:
            batch.delete(Column.DEDUP, key)
            forgotten += 1
    return forgotten


def check_form(store: Store, tid: int, dedup_id: str) -> None:
    """Leader-side: refuse a batch by range for a ``dedup_id`` whose watermark per-record ids set.
    Those are kept until reset; a batch by range would turn the value into a session's, which
    :func:`expire` forgets after the dedup window, and every message at or below the watermark could
    then be stored again (hot-standby publishers resending). Raises :class:`InvalidArgument`."""
    raw = store.get(Column.DEDUP, dedup.watermark_key(tid, dedup_id))
    if raw is not None and len(raw) == _MARK.size and _MARK.unpack(raw)[0] > 0:
        raise InvalidArgument(
            f"dedup_id {dedup_id!r} has per-record msg_ids (watermark {_MARK.unpack(raw)[0]}), kept until reset; "
            f"a first_msg_id batch would make it a session that is forgotten after the dedup window: give each "
            f"record its msg_id, or use another dedup_id")


def check_batch(dedup_id: str, first: int, count: int) -> None:
    """Leader-side checks of a session batch's numbers (raises :class:`InvalidArgument`)."""
    if not dedup_id:
        raise InvalidArgument("first_msg_id needs a dedup_id on the request")
    if first < 1:
        raise InvalidArgument(f"first_msg_id must be >= 1 (a session's messages are numbered from 1), got {first}")
    if first > MSG_ID_MAX - count + 1:
        raise InvalidArgument(f"first_msg_id {first} with {count} records overflows the 64-bit message id "
                              f"(the last id would be {first + count - 1} > {MSG_ID_MAX})")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a session batch's apply does: messages before ``fresh_from`` (an index into the batch)
    are duplicates with ``duplicate_places`` (None: places unknown, offset 0); the rest are stored."""

    state: SessionState
    fresh_from: int
    duplicate_places: list[tuple[int, int, int]] | None


def check(store: Store, tid: int, dedup_id: str, first: int, count: int) -> Verdict:
    """Decide a session batch against the replicated state (raises only :class:`InvalidArgument`)."""
    check_batch(dedup_id, first, count)
    state = load(store, tid, dedup_id)
    if first > state.mark + 1:
        raise SessionOutOfSequence(
            f"first_msg_id {first} of dedup_id {dedup_id!r} leaves a gap: its watermark is {state.mark}, so the "
            f"next batch must start at {state.mark + 1} (or at or below it, as a retry); nothing was stored")
    fresh_from = min(count, state.mark + 1 - first)
    places = state.last.places(first, fresh_from) if state.last is not None and fresh_from else None
    return Verdict(state, fresh_from, places)


def remember(batch: Batch, tid: int, dedup_id: str, first: int, partitions: Sequence[int],
             starts: dict[int, tuple[int, int]]) -> None:
    """Store the new watermark (the last id) and the placement of the stored messages ``first ..``."""
    assert partitions and starts, "remember() is for a batch that stored something"
    mark = first + len(partitions) - 1
    batch.put(Column.DEDUP, dedup.watermark_key(tid, dedup_id), encode(mark, first, partitions, starts))
