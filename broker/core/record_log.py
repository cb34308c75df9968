"""Stored records, one value per applied batch of a partition: the format and every read of it.

Key: ``>IIQ`` = (topic_id, partition, LAST offset of the batch). Keyed by the last offset (not the
first) so that the batch holding offset X is simply the first key >= (tid, p, X): every read is a
forward seek, as with one value per record, and the Store protocol needs no reverse seek; and
``delete_range([(tid, p, start), (tid, p, cut)))`` deletes exactly the batches that lie wholly
before ``cut``. A batch that straddles a cut (retention, prune, clear inside it) stays; the
partition's ``start_offset`` moves to the cut and readers ask only for offsets at or above it.

Value (format 2)::

    header  >BIQ   format (2), count n, first offset (= last - n + 1)
            >nI    ends: the end of record i's frame, counted from the first frame
            >I     CRC32C over (the 16-byte key, the header bytes above)
    frames  n per-record frames, each ``records.frame``: >IqB (crc32c, timestamp_ms, format 1) + body,
            its CRC over the record's OWN 16-byte key (tid, p, offset), timestamp, format and body

A damaged record is therefore reported (as an :class:`Entry` with ``error``, BADMSG to readers)
for that record alone while its neighbours read fine; a damaged header or table reports every
offset of that batch. One applied batch is split into values of at most
``STORED_BATCH_RECORDS_MAX`` records and ``STORED_BATCH_BYTES_MAX`` bytes (a larger lone record
is stored alone), so a point read never decodes more than one bounded value.

Stores written before this format (one format-1 value per record, no ``records_format`` key in
``Column.META``) are upgraded in place by :func:`upgrade`: each old value becomes a batch of one
under the same key (its offset is its last offset). See docs/operations.md for rolling upgrades.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import google_crc32c
from google.protobuf.message import DecodeError

from broker.core import records
from broker.storage import Batch, Column, Store
from broker.v1 import internal_pb2

log = logging.getLogger(__name__)

FORMAT_V2 = 2
STORED_BATCH_RECORDS_MAX = 1024  # records per stored value
STORED_BATCH_BYTES_MAX = 256 * 1024  # frame bytes per stored value (a larger lone record goes alone)
FORMAT_KEY = b"records_format"  # Column.META: >B, the format of every value in Column.RECORDS
_UPGRADE_KEY = b"records_format_upgrade"  # Column.META: the last key upgraded so far (resumable)
UPGRADE_CHUNK_RECORDS = 10_000  # old values rewritten per store write during an upgrade
_HEAD = struct.Struct(">BIQ")
_U32 = struct.Struct(">I")
_TSFMT = struct.Struct(">qB")
_FRAME_BYTES = records.FRAME_BYTES
_KEY = records.RECORD_KEY
assert STORED_BATCH_RECORDS_MAX >= 1 and STORED_BATCH_BYTES_MAX >= 1


class Entry(NamedTuple):
    """One stored offset: its record, or ``error`` (why it cannot be read: BADMSG to readers). A
    tuple: :func:`read` makes one per record read, and a tuple is made several times faster than a
    frozen dataclass."""

    offset: int
    timestamp_ms: int
    body: bytes  # serialized RecordBody (empty when ``error``)
    error: str | None = None


def parse_into(entry: Entry, record: internal_pb2.Record, topic: str, topic_id: int, partition: int) -> str | None:
    """Fill ``record`` from ``entry``: the stored body, then where it is (topic, partition, offset,
    timestamp and the position token after it). Returns why it cannot be read instead (a reader's
    BADMSG), leaving ``record`` partly filled."""
    if entry.error is not None:
        return entry.error
    try:
        record.MergeFromString(entry.body)
    except DecodeError as exc:
        return str(exc)
    offset = entry.offset
    record.topic = topic
    record.partition = partition
    record.offset = offset
    record.timestamp_ms = entry.timestamp_ms
    record.position = records.PositionToken(topic_id, partition, offset + 1).encode()
    return None


class _Damaged(Exception):
    """A stored value whose header or table cannot be trusted."""


@dataclass(frozen=True, slots=True)
class _Value:
    """A decoded header: the value's offsets ``[first, last]`` and frame ends."""

    first: int
    last: int
    ends: tuple[int, ...]
    base: int  # where the first frame starts in ``raw``
    raw: bytes

    def entries(self, prefix_crc: int, begin: int, stop: int) -> Iterator[Entry]:
        """The records at ``begin`` … ``stop - 1`` (in this value), each with its own CRC checked
        (``prefix_crc``: the CRC of the key's first 8 bytes). The hot loop of every read."""
        raw, base, ends = self.raw, self.base, self.ends
        extend, unpack = google_crc32c.extend, records.FRAME.unpack_from
        i = begin - self.first
        start = base + (ends[i - 1] if i else 0)
        for offset in range(begin, stop):
            end = base + ends[i]
            i += 1
            if end - start < _FRAME_BYTES:
                yield Entry(offset, 0, b"", f"stored record of {end - start} bytes is shorter than its frame")
            else:
                crc, timestamp_ms, fmt = unpack(raw, start)
                if extend(extend(prefix_crc, offset.to_bytes(8, "big")), raw[start + 4:end]) != crc:
                    yield Entry(offset, 0, b"", "checksum mismatch")
                elif fmt != records.FORMAT_V1:
                    yield Entry(offset, 0, b"", f"unknown record format {fmt}")
                else:
                    yield Entry(offset, timestamp_ms, raw[start + _FRAME_BYTES:end])
            start = end

    def body_bytes(self, offset: int) -> int:
        i = offset - self.first
        return self.ends[i] - (self.ends[i - 1] if i else 0) - _FRAME_BYTES

    def timestamp_at(self, offset: int) -> int:
        i = offset - self.first
        return int(_TSFMT.unpack_from(self.raw, self.base + (self.ends[i - 1] if i else 0) + 4)[0])


def _decode(key: bytes, raw: bytes) -> _Value:
    """Check a stored value's header and table; raises :class:`_Damaged`."""
    if len(raw) < _HEAD.size + 4:
        raise _Damaged(f"stored batch of {len(raw)} bytes is shorter than its header")
    fmt, count, first = _HEAD.unpack_from(raw)
    if fmt != FORMAT_V2:
        raise _Damaged(f"unknown stored batch format {fmt}")
    base = _HEAD.size + 4 * count + 4
    if count < 1 or base > len(raw):
        raise _Damaged(f"stored batch header claims {count} records in {len(raw)} bytes")
    crc = _U32.unpack_from(raw, base - 4)[0]
    if google_crc32c.extend(google_crc32c.value(key), raw[:base - 4]) != crc:
        raise _Damaged("batch header checksum mismatch")
    last = _KEY.unpack(key)[2]
    ends = struct.unpack_from(f">{count}I", raw, _HEAD.size)
    if first + count - 1 != last or ends[-1] != len(raw) - base:
        raise _Damaged(f"stored batch header does not match its key (offsets {first}+{count}, key {last})")
    return _Value(first, last, ends, base, raw)


def encode(tid: int, partition: int, first: int, frames: Sequence[bytes]) -> tuple[bytes, bytes]:
    """The (key, value) of one stored batch of already framed records at ``first``, ``first + 1``…"""
    ends, end = [], 0
    for f in frames:
        end += len(f)
        ends.append(end)
    return _encode(tid, partition, first, ends, frames)


def _encode(tid: int, partition: int, first: int, ends: list[int], parts: Sequence[bytes]) -> tuple[bytes, bytes]:
    """(key, value) of the records at ``first``… whose frames end at ``ends`` and are ``parts`` joined."""
    count = len(ends)
    assert count >= 1, "a stored batch holds at least one record"
    key = _KEY.pack(tid, partition, first + count - 1)
    head = _HEAD.pack(FORMAT_V2, count, first) + struct.pack(f">{count}I", *ends)
    return key, b"".join((head, _U32.pack(google_crc32c.value(key + head)), *parts))


def append(batch: Batch, tid: int, partition: int, first: int, items: Sequence[tuple[int, bytes]]) -> None:
    """Write ``items`` [(timestamp_ms, body)] at offsets ``first``, ``first + 1``… into ``batch``, as
    values of at most ``STORED_BATCH_RECORDS_MAX`` records / ``STORED_BATCH_BYTES_MAX`` bytes. The
    hot path of every replica's apply: per record one CRC over (key, timestamp, format, body) and
    three slices appended, no per-record bytes object built."""
    prefix_crc = google_crc32c.value(_KEY.pack(tid, partition, 0)[:8])
    extend, pack_u32, pack_ts = google_crc32c.extend, _U32.pack, _TSFMT.pack
    parts: list[bytes] = []
    ends: list[int] = []
    chunk_bytes, chunk_first, offset = 0, first, first
    last_ts, head = None, b""
    for ts, body in items:
        if ts != last_ts:
            last_ts, head = ts, pack_ts(ts, records.FORMAT_V1)
        size = _FRAME_BYTES + len(body)
        if ends and (len(ends) >= STORED_BATCH_RECORDS_MAX or chunk_bytes + size > STORED_BATCH_BYTES_MAX):
            batch.put(Column.RECORDS, *_encode(tid, partition, chunk_first, ends, parts))
            parts, ends, chunk_bytes, chunk_first = [], [], 0, offset
        parts += (pack_u32(extend(extend(prefix_crc, offset.to_bytes(8, "big") + head), body)), head, body)
        chunk_bytes += size
        ends.append(chunk_bytes)
        offset += 1
    if ends:
        batch.put(Column.RECORDS, *_encode(tid, partition, chunk_first, ends, parts))


def _values(store: Store, tid: int, partition: int, begin: int, limit: int) -> Iterator[tuple[bytes, bytes]]:
    """Stored values of a partition from the one holding ``begin`` on, at most ``limit`` (every value
    holds at least one offset, so ``limit`` = the offsets wanted bounds what a store may copy)."""
    return store.scan(Column.RECORDS, _KEY.pack(tid, partition, begin), _KEY.pack(tid, partition + 1, 0)
                      if partition < 0xFFFFFFFF else _KEY.pack(tid + 1, 0, 0), limit)


def read(store: Store, tid: int, partition: int, begin: int, end: int, limit: int | None = None
         ) -> Iterator[Entry]:
    """Stored offsets in ``[begin, end)`` in order, at most ``limit`` of them; offsets that are not
    stored (deleted) are absent, unreadable ones come with ``error``. ``begin`` must be at or above
    the partition's start offset (records below it in a straddling batch are deleted ones)."""
    left = end - begin if limit is None else min(limit, end - begin)
    if left <= 0:
        return
    prefix_crc = google_crc32c.value(_KEY.pack(tid, partition, 0)[:8])
    expected = begin  # the first offset a damaged value may stand for
    for key, raw in _values(store, tid, partition, begin, left):
        try:
            value = _decode(key, raw)
        except _Damaged as exc:
            last = _KEY.unpack(key)[2]
            for offset in range(expected, min(last + 1, end)):
                yield Entry(offset, 0, b"", str(exc))
                left -= 1
                if left <= 0:
                    return
            if last + 1 >= end:
                return
            expected = last + 1
            continue
        offset = max(value.first, begin)
        stop = min(value.last + 1, end, offset + left)
        yield from value.entries(prefix_crc, offset, stop)
        left -= stop - offset
        if left <= 0 or stop >= end:
            return
        expected = value.last + 1


def get(store: Store, tid: int, partition: int, offset: int, start_offset: int) -> Entry | None:
    """The record at ``offset``, or None if it is not stored (below ``start_offset``, the
    partition's first retained offset, or deleted)."""
    if offset < start_offset:
        return None
    for entry in read(store, tid, partition, offset, offset + 1):
        return entry if entry.offset == offset else None
    return None


def timestamp_at(store: Store, tid: int, partition: int, offset: int) -> int | None:
    """The timestamp of the record at ``offset`` without checking its CRC (time-index searches), or
    None if it is not stored or its batch is damaged."""
    for key, raw in _values(store, tid, partition, offset, 1):
        try:
            value = _decode(key, raw)
        except _Damaged:
            return None
        return value.timestamp_at(offset) if value.first <= offset else None
    return None


def offset_for_time(store: Store, tid: int, partition: int, timestamp_ms: int, lo: int, hi: int) -> int:
    """First offset in ``[lo, hi)`` whose timestamp is >= ``timestamp_ms`` (``hi`` if none). A binary
    search: it relies on timestamps never decreasing within a partition, which the state machine's
    log-append time guarantees (``max(leader now_ms, previous timestamp)`` at apply, whatever the
    leaders' clocks do). Subscribing from a timestamp and retention by age both use it. A missing
    record (or one in a damaged batch) counts as older."""
    while lo < hi:
        mid = (lo + hi) // 2
        ts = timestamp_at(store, tid, partition, mid)
        if ts is None or ts < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo


def sizes(store: Store, tid: int, partition: int, begin: int, end: int) -> Iterator[tuple[int, int]]:
    """(offset, body bytes) of the stored records in ``[begin, end)``, oldest first, from the
    tables (no record CRC is checked); offsets of a damaged batch count with 0 bytes (logged)."""
    if end <= begin:
        return
    expected = begin
    for key, raw in _values(store, tid, partition, begin, end - begin):
        try:
            value = _decode(key, raw)
        except _Damaged as exc:
            last = _KEY.unpack(key)[2]
            log.error("topic id %d partition %d: the stored batch ending at %d is damaged (%s): its records "
                      "count with 0 bytes", tid, partition, last, exc)
            yield from ((o, 0) for o in range(expected, min(last + 1, end)))
            if last + 1 >= end:
                return
            expected = last + 1
            continue
        for offset in range(max(value.first, begin), min(value.last + 1, end)):
            yield offset, value.body_bytes(offset)
        if value.last + 1 >= end:
            return
        expected = value.last + 1


def delete_before(batch: Batch, tid: int, partition: int, start: int, before: int) -> None:
    """Delete the stored values that lie wholly in ``[start, before)`` (a straddling one stays)."""
    batch.delete_range(Column.RECORDS, _KEY.pack(tid, partition, start), _KEY.pack(tid, partition, before))


# -- format upgrade ------------------------------------------------------------------------------
def upgrade(store: Store) -> int:
    """Bring ``store`` to format 2; returns how many old values were rewritten. A store without
    ``FORMAT_KEY`` holds format-1 values (one per record, written before this module): each becomes
    a batch of one under the same key. Resumable: every write carries the last key done, and a
    crash in the middle continues after it. Writes ``FORMAT_KEY`` when done (also on an empty
    store), so later opens cost one point read."""
    if store.get(Column.META, FORMAT_KEY) == bytes([FORMAT_V2]):
        return 0
    done = store.get(Column.META, _UPGRADE_KEY)
    old = next(iter(store.scan(Column.RECORDS, done + b"\x00" if done else b"", b"\xff" * (_KEY.size + 1), 1)), None)
    if old is not None:  # no clock here (the apply side is deterministic): the log lines' times give the duration
        log.warning("upgrading the record store to format %d (one value per applied batch)", FORMAT_V2)
    begin = done + b"\x00" if done else b""
    rewritten = 0
    while True:
        batch = store.batch()
        last = None
        for key, raw in store.scan(Column.RECORDS, begin, b"\xff" * (_KEY.size + 1), UPGRADE_CHUNK_RECORDS):
            last = key
            if len(key) != _KEY.size:
                continue
            tid, partition, offset = _KEY.unpack(key)
            batch.put(Column.RECORDS, *encode(tid, partition, offset, [raw]))
            rewritten += 1
        if last is None:
            break
        batch.put(Column.META, _UPGRADE_KEY, last)
        store.write(batch)
        begin = last + b"\x00"
    batch = store.batch()
    batch.put(Column.META, FORMAT_KEY, bytes([FORMAT_V2]))
    batch.delete(Column.META, _UPGRADE_KEY)
    store.write(batch, sync=True)
    if old is not None:
        log.warning("upgraded the record store to format %d: %d stored records rewritten as batches of one",
                    FORMAT_V2, rewritten)
    return rewritten
