"""Stored records, one value per applied batch of a partition: the format and every read of it.

Key: ``>IIQ`` = (topic_id, partition, LAST offset of the batch). Keyed by the last offset (not the
first) so that the batch holding offset X is simply the first key >= (tid, p, X): every read is a
forward seek, as with one value per record, and the Store protocol needs no reverse seek; and
``delete_range([(tid, p, start), (tid, p, cut)))`` deletes exactly the batches that lie wholly
before ``cut``. A batch that straddles a cut (retention, prune, clear inside it) stays; the
partition's ``start_offset`` moves to the cut and readers ask only for offsets at or above it.

Value (format 3, written by every apply)::

    header  >BIQ   format (3), count n, first offset (= last - n + 1)
            >nI    ends: the end of record i's element, counted from the first element
            >nI    record i's CRC32C over its body (the header CRC below binds it to the key, the
                   record's place in the value and its timestamp)
            >I     r, then r x >Iq (records, timestamp_ms): the timestamps in runs, in offset order
            >I     CRC32C over the elements
            >I     CRC32C over (the 16-byte key, every header byte above)
    elements  n protobuf elements of field 1: 0x0a, varint(len(body)), body

The elements are a ``CompactBatch``'s (and a ``RecordBatch``'s) ``records`` as they stand, so a
compact read (``broker.leader.packed_reads``) sends a run of them with no work per record:
:func:`read_spans` hands out each intact value's stretch as a :class:`Span` once the elements' one
CRC matched. When it does not, every record is checked against its own CRC, so a damaged record
is still reported (an :class:`Entry` with ``error``, BADMSG to readers) for that record alone while
its neighbours read fine; a damaged header or table reports every offset of that value.

Value (format 2, written before format 3; still read)::

    header  >BIQ   format (2), count n, first offset (= last - n + 1)
            >nI    ends: the end of record i's frame, counted from the first frame
            >I     CRC32C over (the 16-byte key, the header bytes above)
    frames  n per-record frames, each ``records.frame``: >IqB (crc32c, timestamp_ms, format 1) + body,
            its CRC over the record's OWN 16-byte key (tid, p, offset), timestamp, format and body

Skeleton (format 4: the durable shadow of a `memory` topic's value, from command format 5)::

    header  >BIQ   format (4), count n, first offset (= last - n + 1)
            >nI    record i's body bytes
            >I     r, then r x >Iq (records, timestamp_ms): the timestamps in runs, in offset order
            >I     CRC32C over (the 16-byte key, every header byte above)

A `memory` topic keeps its records in each node's memory only (SPEC §2.1), so a restarted node
has none; the applies that decide from their sizes and timestamps (retention, prune) read these
skeletons instead, which every node has (written in the durable store, under the same keys as the
values they shadow, by every apply from command format 5 on: ``append(..., skeletons=batch)``).
:func:`sizes`, :func:`timestamp_at` and :func:`offset_for_time` read them; a read of records
reports each offset of one as unreadable (nothing reads records from the durable store of a
`memory` topic). docs/design/memory-topics.md.

Even skeleton (format 5), written once per `memory` partition by the apply that raises the
command format to 5, for the records written before it (which have no skeleton)::

    header  >BIQ   format (5), count n, first offset
            >Q     the records' bytes together, as the partition's counters hold them: each record
                   counts ``total // n``, the first ``total % n`` one byte more
            >I     r, then r x >Iq (records, timestamp_ms): one run, the partition's last timestamp
                   then (no record of them is younger; age retention keeps them until it is old)
            >I     CRC32C over (the 16-byte key, every header byte above)

The formats live side by side in one store (the format byte leads each value); nothing rewrites
a format-2 value. One applied batch is split into values of at most ``STORED_BATCH_RECORDS_MAX``
records and ``STORED_BATCH_BYTES_MAX`` bytes (a larger lone record is stored alone), so a point
read never decodes more than one bounded value.

Stores written before format 2 (one format-1 value per record, no ``records_format`` key in
``Column.META``) are upgraded in place by :func:`upgrade`: each old value becomes a format-2 batch
of one under the same key (its offset is its last offset). ``records_format`` stays 2 (no format-1
value is left) with format-3 values beside. See docs/operations.md for rolling upgrades.
"""

from __future__ import annotations

import logging
import operator
import struct
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, groupby, repeat
from typing import NamedTuple

import google_crc32c
from google.protobuf.message import DecodeError

from broker.core import records
from broker.protowire import varint
from broker.storage import Batch, Column, Store
from broker.v1 import internal_pb2

log = logging.getLogger(__name__)

FORMAT_V2 = 2
FORMAT_V3 = 3
FORMAT_SKELETON = 4
FORMAT_EVEN_SKELETON = 5
STORED_BATCH_RECORDS_MAX = 1024  # records per stored value
STORED_BATCH_BYTES_MAX = 256 * 1024  # frame bytes per stored value (a larger lone record goes alone)
FORMAT_KEY = b"records_format"  # Column.META: >B, the format of every value in Column.RECORDS
_UPGRADE_KEY = b"records_format_upgrade"  # Column.META: the last key upgraded so far (resumable)
UPGRADE_CHUNK_RECORDS = 10_000  # old values rewritten per store write during an upgrade
_HEAD = struct.Struct(">BIQ")
_U32 = struct.Struct(">I")
_TSFMT = struct.Struct(">qB")
_RUN = struct.Struct(">Iq")
_FIELD1 = b"\x0a"  # protobuf field 1, length-delimited
_PREFIXES = 1 << 14  # element prefixes made once: every body shorter than this (a 2-byte varint)
_ELEMENT_PREFIX = [_FIELD1 + varint(n) for n in range(_PREFIXES)]
# by an element's length (the prefix's too): the length of its prefix, for every element whose
# body is shorter than _PREFIXES (a body of 127 bytes makes an element of 129, one of 128 of 131)
_PREFIX_BYTES = [2 if n < 130 else 3 for n in range(_PREFIXES + 3)]
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


@dataclass(slots=True)
class _Value:
    """A decoded header: the value's offsets ``[first, last]``, record ends and (format 3) CRCs and
    timestamp runs."""

    first: int
    last: int
    ends: tuple[int, ...]
    base: int  # where the first frame (format 2) or element (format 3) starts in ``raw``
    raw: bytes
    crcs: tuple[int, ...] = ()  # format 3: each record's CRC
    runs: tuple[tuple[int, int], ...] = ()  # format 3: (records, timestamp_ms) in offset order
    elements_crc: int = 0  # format 3
    sizes: tuple[int, ...] = ()  # format 4 (a skeleton): each record's body bytes, and no bodies
    even: tuple[int, int] | None = None  # format 5 (an even skeleton): (bytes of each, how many have one more)

    @property
    def skeleton(self) -> bool:
        return bool(self.sizes) or self.even is not None
    _intact: bool | None = None  # format 3: whether the elements' CRC matched (checked once)

    @property
    def v3(self) -> bool:
        return bool(self.crcs)

    def intact(self) -> bool:
        """Format 3: the elements are as written (one CRC over all of them)."""
        if self._intact is None:
            self._intact = google_crc32c.value(self.raw[self.base:]) == self.elements_crc
        return self._intact

    def entries(self, prefix_crc: int, begin: int, stop: int) -> Iterator[Entry]:
        """The records at ``begin`` … ``stop - 1`` (in this value), each with its own CRC checked
        (``prefix_crc``: the CRC of the key's first 8 bytes) unless the format-3 elements' one CRC
        matched. The hot loop of every read of whole records."""
        if self.skeleton:
            yield from (Entry(offset, 0, b"", "a skeleton holds no record") for offset in range(begin, stop))
            return
        if self.v3:
            yield from self._entries_v3(begin, stop)
            return
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

    def _entries_v3(self, begin: int, stop: int) -> Iterator[Entry]:
        raw, base, ends, crcs = self.raw, self.base, self.ends, self.crcs
        # a few records of a large value (a point read): their own CRCs cost less than the value's
        intact = self.intact() if self._intact is not None or (stop - begin) * 16 >= len(ends) else False
        crc = google_crc32c.value
        i = begin - self.first
        start = base + (ends[i - 1] if i else 0)
        stamps = self._stamps(i, stop - begin)
        if intact:  # the elements are as written: each one's length prefix is 1, 2 or more bytes
            for offset, ts in zip(range(begin, stop), stamps, strict=True):
                end = base + ends[i]
                i += 1
                size = end - start
                at = start + 2 if size < 130 else start + 3 if size < 16387 else _body_start(raw, start, end)
                yield Entry(offset, ts, raw[at:end])
                start = end
            return
        for offset, ts in zip(range(begin, stop), stamps, strict=True):
            end = base + ends[i]
            body_at = _body_start(raw, start, end)
            if body_at < 0:
                yield Entry(offset, 0, b"", "stored record's element is malformed")
            else:
                body = raw[body_at:end]
                if crc(body) == crcs[i]:
                    yield Entry(offset, ts, body)
                else:
                    yield Entry(offset, 0, b"", "checksum mismatch")
            i += 1
            start = end

    def _stamps(self, index: int, count: int) -> list[int]:
        """The timestamps of records ``index`` … ``index + count - 1`` of this format-3 value."""
        out: list[int] = []
        for n, ts in self.runs_of(index, count):
            out += [ts] * n
        return out

    def runs_of(self, index: int, count: int) -> list[tuple[int, int]]:
        """The timestamp runs of records ``index`` … ``index + count - 1`` of this format-3 value."""
        out = []
        at = 0
        for n, ts in self.runs:
            lo, hi = max(at, index), min(at + n, index + count)
            if lo < hi:
                out.append((hi - lo, ts))
            at += n
            if at >= index + count:
                break
        return out

    def body_bytes(self, offset: int) -> int:
        i = offset - self.first
        if self.sizes:
            return self.sizes[i]
        if self.even is not None:
            return self.even[0] + (i < self.even[1])
        start, end = self.base + (self.ends[i - 1] if i else 0), self.base + self.ends[i]
        if self.v3:
            body_at = _body_start(self.raw, start, end)
            return end - body_at if body_at >= 0 else 0
        return end - start - _FRAME_BYTES

    def bytes_between(self, lo: int, hi: int) -> int:
        """The body bytes of records ``lo`` … ``hi - 1`` of this value (indexes, not offsets), each
        as :meth:`body_bytes` counts it. No Python step per record for a skeleton, nor for an intact
        format-3 value whose bodies are all shorter than 16 KiB: a prune or a retention cut of
        millions of records counts them in one apply, on the Raft thread."""
        if self.sizes:
            return sum(self.sizes[lo:hi])
        if self.even is not None:
            each, more = self.even
            return (hi - lo) * each + max(0, min(hi, more) - lo)
        if self.v3 and hi > lo:
            ends = self.ends
            before = ends[lo - 1] if lo else 0
            lengths = list(map(operator.sub, ends[lo:hi], (before, *ends[lo:hi - 1])))
            if max(lengths) < len(_PREFIX_BYTES) and self.intact():
                return ends[hi - 1] - before - sum(map(_PREFIX_BYTES.__getitem__, lengths))
        return sum(self.body_bytes(self.first + i) for i in range(lo, hi))

    def timestamp_at(self, offset: int) -> int:
        i = offset - self.first
        if self.v3 or self.skeleton:
            return self._stamps(i, 1)[0]
        return int(_TSFMT.unpack_from(self.raw, self.base + (self.ends[i - 1] if i else 0) + 4)[0])


def _body_start(raw: bytes, start: int, end: int) -> int:
    """Where the body of the element ``raw[start:end]`` starts (after 0x0a and the varint of its
    length), or -1 when the element is not one field-1 element of exactly that length."""
    if end - start < 2 or raw[start] != 0x0A:
        return -1
    at, length, shift = start + 1, 0, 0
    while at < end and shift < 64:
        byte = raw[at]
        at += 1
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            return at if at + length == end else -1
        shift += 7
    return -1


def _decode(key: bytes, raw: bytes) -> _Value:
    """Check a stored value's header and table; raises :class:`_Damaged`."""
    if len(raw) < _HEAD.size + 4:
        raise _Damaged(f"stored batch of {len(raw)} bytes is shorter than its header")
    fmt, count, first = _HEAD.unpack_from(raw)
    if fmt == FORMAT_V3:
        return _decode_v3(key, raw, count, first)
    if fmt == FORMAT_SKELETON:
        return _decode_skeleton(key, raw, count, first)
    if fmt == FORMAT_EVEN_SKELETON:
        return _decode_even_skeleton(key, raw, count, first)
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


def _decode_v3(key: bytes, raw: bytes, count: int, first: int) -> _Value:
    runs_at = _HEAD.size + 8 * count
    if count < 1 or runs_at + 4 > len(raw):
        raise _Damaged(f"stored batch header claims {count} records in {len(raw)} bytes")
    nruns = _U32.unpack_from(raw, runs_at)[0]
    base = runs_at + 4 + _RUN.size * nruns + 8
    if nruns < 1 or base > len(raw):
        raise _Damaged(f"stored batch header claims {nruns} timestamp runs in {len(raw)} bytes")
    elements_crc, crc = struct.unpack_from(">II", raw, base - 8)
    if google_crc32c.extend(google_crc32c.value(key), raw[:base - 4]) != crc:
        raise _Damaged("batch header checksum mismatch")
    last = _KEY.unpack(key)[2]
    ends = struct.unpack_from(f">{count}I", raw, _HEAD.size)
    runs = tuple(_RUN.iter_unpack(raw[runs_at + 4:base - 8]))
    if first + count - 1 != last or ends[-1] != len(raw) - base or sum(n for n, _ in runs) != count:
        raise _Damaged(f"stored batch header does not match its key (offsets {first}+{count}, key {last})")
    crcs = struct.unpack_from(f">{count}I", raw, _HEAD.size + 4 * count)
    return _Value(first, last, ends, base, raw, crcs, runs, elements_crc)


_EVEN = struct.Struct(">Q")


def _skeleton_runs(key: bytes, raw: bytes, count: int, first: int, runs_at: int) -> tuple[tuple[int, int], ...]:
    """The timestamp runs of a skeleton (format 4 or 5) whose runs start at ``runs_at``, its CRC and
    its offsets checked against its key; raises :class:`_Damaged`."""
    if count < 1 or runs_at + 4 > len(raw):
        raise _Damaged(f"stored skeleton header claims {count} records in {len(raw)} bytes")
    nruns = _U32.unpack_from(raw, runs_at)[0]
    end = runs_at + 4 + _RUN.size * nruns
    if nruns < 1 or end + 4 != len(raw):
        raise _Damaged(f"stored skeleton claims {nruns} timestamp runs in {len(raw)} bytes")
    if google_crc32c.extend(google_crc32c.value(key), raw[:end]) != _U32.unpack_from(raw, end)[0]:
        raise _Damaged("skeleton checksum mismatch")
    runs = tuple(_RUN.iter_unpack(raw[runs_at + 4:end]))
    if first + count - 1 != _KEY.unpack(key)[2] or sum(n for n, _ in runs) != count:
        raise _Damaged(f"stored skeleton does not match its key (offsets {first}+{count})")
    return runs


def _decode_skeleton(key: bytes, raw: bytes, count: int, first: int) -> _Value:
    runs = _skeleton_runs(key, raw, count, first, _HEAD.size + 4 * count)
    sizes = struct.unpack_from(f">{count}I", raw, _HEAD.size)
    return _Value(first, first + count - 1, (), len(raw), raw, runs=runs, sizes=sizes)


def _decode_even_skeleton(key: bytes, raw: bytes, count: int, first: int) -> _Value:
    runs = _skeleton_runs(key, raw, count, first, _HEAD.size + _EVEN.size)
    total = _EVEN.unpack_from(raw, _HEAD.size)[0]
    return _Value(first, first + count - 1, (), len(raw), raw, runs=runs, even=divmod(total, count))


def put_even_skeleton(batch: Batch, tid: int, partition: int, first: int, count: int, total_bytes: int,
                      timestamp_ms: int) -> None:
    """Put the even skeleton (format 5) of ``count`` records from ``first`` holding ``total_bytes``,
    none younger than ``timestamp_ms``."""
    assert count >= 1 and total_bytes >= 0, (count, total_bytes)
    key = _KEY.pack(tid, partition, first + count - 1)
    head = b"".join((_HEAD.pack(FORMAT_EVEN_SKELETON, count, first), _EVEN.pack(total_bytes), _U32.pack(1),
                     _RUN.pack(count, timestamp_ms)))
    batch.put(Column.RECORDS, key, head + _U32.pack(google_crc32c.value(key + head)))


def _encode_skeleton(key: bytes, first: int, sizes: Sequence[int], runs: list[list[int]]) -> bytes:
    count = len(sizes)
    head = b"".join((_HEAD.pack(FORMAT_SKELETON, count, first), struct.pack(f">{count}I", *sizes),
                     _U32.pack(len(runs)), b"".join(_RUN.pack(n, ts) for n, ts in runs)))
    return head + _U32.pack(google_crc32c.value(key + head))


def encode(tid: int, partition: int, first: int, frames: Sequence[bytes]) -> tuple[bytes, bytes]:
    """The (key, value) of one format-2 batch of already framed records at ``first``, ``first + 1``…
    (the format-1 upgrade writes these)."""
    ends, end = [], 0
    for f in frames:
        end += len(f)
        ends.append(end)
    count = len(ends)
    assert count >= 1, "a stored batch holds at least one record"
    key = _KEY.pack(tid, partition, first + count - 1)
    head = _HEAD.pack(FORMAT_V2, count, first) + struct.pack(f">{count}I", *ends)
    return key, b"".join((head, _U32.pack(google_crc32c.value(key + head)), *frames))


def _encode_v3(tid: int, partition: int, first: int, ends: list[int], crcs: list[int],
               runs: list[list[int]], parts: list[bytes]) -> tuple[bytes, bytes]:
    """(key, value) of the records at ``first``… whose elements end at ``ends`` and are ``parts`` joined."""
    count = len(ends)
    assert count >= 1, "a stored batch holds at least one record"
    key = _KEY.pack(tid, partition, first + count - 1)
    elements = b"".join(parts)
    head = b"".join((_HEAD.pack(FORMAT_V3, count, first), struct.pack(f">{count}I", *ends),
                     struct.pack(f">{count}I", *crcs), _U32.pack(len(runs)),
                     b"".join(_RUN.pack(n, ts) for n, ts in runs), _U32.pack(google_crc32c.value(elements))))
    return key, b"".join((head, _U32.pack(google_crc32c.value(key + head)), elements))


def append(batch: Batch, tid: int, partition: int, first: int, timestamp_ms: int, bodies: Sequence[bytes],
           skeletons: Batch | None = None) -> None:
    """Write ``bodies``, all stamped ``timestamp_ms``, at offsets ``first``, ``first + 1``… into
    ``batch``, as format-3 values of at most ``STORED_BATCH_RECORDS_MAX`` records /
    ``STORED_BATCH_BYTES_MAX`` bytes (a larger lone record alone). The hot path of every replica's
    apply: every per-record step (length, element prefix, end, CRC over the body) is a C loop
    (``map``, ``accumulate``), no Python step and no bytes object built per record; one CRC per
    value over its elements. One timestamp per call: an apply stamps every record of a partition
    alike (``broker.core.append``), so a value written here holds a single timestamp run.
    ``skeletons``: also write each value's skeleton (format 4, same key) there (a `memory` topic's
    durable batch)."""
    n = len(bodies)
    if not n:
        return
    lengths = list(map(len, bodies))
    if max(lengths) < _PREFIXES:
        prefixes = list(map(_ELEMENT_PREFIX.__getitem__, lengths))
    else:
        prefixes = [_FIELD1 + varint(length) for length in lengths]
    ends = list(accumulate(map(operator.add, map(len, prefixes), lengths)))  # from the first element
    crcs = list(map(google_crc32c.value, bodies))
    parts: list[bytes] = [b""] * (2 * n)
    parts[0::2] = prefixes
    parts[1::2] = bodies
    start, base = 0, 0
    while start < n:  # each value: the most records that fit both caps, at least one
        stop = max(start + 1, bisect_right(ends, base + STORED_BATCH_BYTES_MAX, start,
                                           min(n, start + STORED_BATCH_RECORDS_MAX)))
        value_ends = list(map(operator.sub, ends[start:stop], repeat(base)))
        key, value = _encode_v3(tid, partition, first + start, value_ends, crcs[start:stop],
                                [[stop - start, timestamp_ms]], parts[2 * start:2 * stop])
        batch.put(Column.RECORDS, key, value)
        if skeletons is not None:
            skeletons.put(Column.RECORDS, key, _encode_skeleton(key, first + start, lengths[start:stop],
                                                                [[stop - start, timestamp_ms]]))
        start, base = stop, ends[stop - 1]


@dataclass(frozen=True, slots=True)
class Span:
    """Consecutive intact records of one format-3 value, as :func:`read_spans` hands them out: the
    value and the records' indexes ``[index, index + count)`` in it."""

    first: int  # the offset of the first record
    count: int
    value: _Value
    index: int
    prefix_crc: int  # the CRC of the key's first 8 bytes

    def element_bytes(self, k: int) -> int:
        """Bytes of the first ``k`` records' elements."""
        ends, i = self.value.ends, self.index
        return ends[i + k - 1] - (ends[i - 1] if i else 0)

    def fitting(self, budget: int, framing_bytes: int) -> int:
        """How many of the first records fit ``budget`` bytes, each counted as its element plus
        ``framing_bytes`` (a binary search over the ends table)."""
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.element_bytes(mid) + framing_bytes * mid <= budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def elements(self, k: int) -> bytes:
        """The first ``k`` records' elements (protobuf field 1, as a ``CompactBatch`` holds them)."""
        v, i = self.value, self.index
        start = v.base + (v.ends[i - 1] if i else 0)
        return v.raw[start:v.base + v.ends[i + k - 1]]

    def runs(self, k: int) -> list[tuple[int, int]]:
        """(records, timestamp_ms) runs of the first ``k`` records."""
        return self.value.runs_of(self.index, k)

    def entries(self) -> Iterator[Entry]:
        """The same records as :class:`Entry` values (a reader that wants them one by one)."""
        return self.value.entries(self.prefix_crc, self.first, self.first + self.count)


# A read of a partition from ``begin`` at least this many records before its ``end`` tells the store
# that the keys below ``begin`` are passed (``Store.release_pages``: a reader catching up leaves no page
# cache behind it). Nearer the head the records are in the memtable, whose keys no table file holds
# yet, so a reader keeping up (a small read per apply, at thousands a second) skips the call; so do
# lookups of one record and the time index's probes.
PASSING_MIN_RECORDS = 1024


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
    return _read(store, tid, partition, begin, end, limit, False)  # type: ignore[return-value]


def read_spans(store: Store, tid: int, partition: int, begin: int, end: int, limit: int | None = None
               ) -> Iterator[Entry | Span]:
    """:func:`read` with each intact format-3 value's records as one :class:`Span` (no work per
    record); records of format-2 or damaged values come as :class:`Entry` values, as from :func:`read`."""
    return _read(store, tid, partition, begin, end, limit, True)


def entries_of(items: Iterator[Entry | Span]) -> Iterator[Entry]:
    """``items`` of :func:`read_spans` as :class:`Entry` values only."""
    for item in items:
        if isinstance(item, Span):
            yield from item.entries()
        else:
            yield item


def _read(store: Store, tid: int, partition: int, begin: int, end: int, limit: int | None,
          spans: bool) -> Iterator[Entry | Span]:
    left = end - begin if limit is None else min(limit, end - begin)
    if left <= 0:
        return
    prefix_crc = google_crc32c.value(_KEY.pack(tid, partition, 0)[:8])
    if begin > 0 and end - begin >= PASSING_MIN_RECORDS:  # going through the partition: below is passed
        store.release_pages(Column.RECORDS, _KEY.pack(tid, partition, 0), _KEY.pack(tid, partition, begin))
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
        if spans and value.v3 and value.intact():
            yield Span(offset, stop - offset, value, offset - value.first, prefix_crc)
        else:
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


def sizes(store: Store, tid: int, partition: int, begin: int, end: int, *, fill: bool = False
          ) -> Iterator[tuple[int, int]]:
    """(offset, body bytes) of the stored records in ``[begin, end)``, oldest first, from the
    tables (no record CRC is checked); offsets of a damaged batch count with 0 bytes (logged).
    ``fill``: every offset of ``[begin, end)``, one that is not stored with 0 bytes (a partition
    has no gaps: a `memory` topic's records written before its skeletons have none)."""
    if fill:
        expected = begin
        for offset, size in sizes(store, tid, partition, begin, end):
            yield from ((o, 0) for o in range(expected, offset))
            yield offset, size
            expected = offset + 1
        yield from ((o, 0) for o in range(expected, end))
        return
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


def _readable_values(store: Store, tid: int, partition: int, begin: int, end: int) -> Iterator[_Value]:
    """The decoded stored values holding offsets of ``[begin, end)``, in order; a damaged one is
    logged and left out (its records count 0 bytes, as :func:`sizes` counts them)."""
    for key, raw in (_values(store, tid, partition, begin, end - begin) if end > begin else ()):
        last = _KEY.unpack(key)[2]
        try:
            yield _decode(key, raw)
        except _Damaged as exc:
            log.error("topic id %d partition %d: the stored batch ending at %d is damaged (%s): its records "
                      "count with 0 bytes", tid, partition, last, exc)
        if last + 1 >= end:
            return


def bytes_in(store: Store, tid: int, partition: int, begin: int, end: int) -> int:
    """The body bytes of the stored records in ``[begin, end)`` (as :func:`sizes` counts them: a
    damaged value's with 0), summed per value (:meth:`_Value.bytes_between`)."""
    return sum(value.bytes_between(max(value.first, begin) - value.first, min(value.last + 1, end) - value.first)
               for value in _readable_values(store, tid, partition, begin, end))


def cut_for_bytes(store: Store, tid: int, partition: int, begin: int, end: int, excess: int) -> tuple[int, int]:
    """``(before, left)``: the first ``before`` in ``[begin, end]`` whose stored records ``[begin,
    before)`` hold at least ``excess`` body bytes (as :func:`sizes` counts them, ``fill``: an offset
    not stored or in a damaged value counts 0), and ``left`` = 0; or ``(end, what is still missing)``
    when all of them hold less. Retention by bytes: the whole values it passes are summed per value
    (:meth:`_Value.bytes_between`), only the one it stops in is walked record by record (a cap cut
    from gigabytes to megabytes walked millions of records in one apply and cost the leadership)."""
    if excess <= 0 or end <= begin:
        return begin, max(excess, 0)
    for value in _readable_values(store, tid, partition, begin, end):
        lo, hi = max(value.first, begin), min(value.last + 1, end)
        whole = value.bytes_between(lo - value.first, hi - value.first)
        if whole < excess:
            excess -= whole
            continue
        for offset in range(lo, hi):
            excess -= value.body_bytes(offset)
            if excess <= 0:
                return offset + 1, 0
    return end, excess


def skeleton_marks(store: Store, tid: int, partition: int, begin: int, end: int) -> dict[int, tuple[int, int]]:
    """``{offset: (body bytes, timestamp_ms)}`` of the records in ``[begin, end)`` that a skeleton of
    their own describes (format 4: a `memory` topic's records from command format 5 on); records of an
    even skeleton (format 5, written before it), of a damaged one, or of none are absent. What a
    record copied back from another node must match (``BrokerStateMachine.refill``)."""
    marks: dict[int, tuple[int, int]] = {}
    for key, raw in (_values(store, tid, partition, begin, end - begin) if end > begin else ()):
        try:
            value = _decode(key, raw)
        except _Damaged:
            value = None
        if value is not None and value.sizes:
            lo, hi = max(value.first, begin), min(value.last + 1, end)
            stamps = value._stamps(lo - value.first, hi - lo)
            for offset, ts in zip(range(lo, hi), stamps, strict=True):
                marks[offset] = (value.sizes[offset - value.first], ts)
        if _KEY.unpack(key)[2] + 1 >= end:
            break
    return marks


def delete_before(batch: Batch, tid: int, partition: int, start: int, before: int) -> None:
    """Delete the stored values that lie wholly in ``[start, before)`` (a straddling one stays)."""
    batch.delete_range(Column.RECORDS, _KEY.pack(tid, partition, start), _KEY.pack(tid, partition, before))


def rewrite_straddling(store: Store, tid: int, partition: int, before: int) -> None:
    """Rewrite the value holding ``before`` with only its records from ``before`` on, when it holds
    earlier ones too. For a store in memory (`memory` topics): there a value kept for its tail
    holds the memory of its whole batch, which the counters no longer count (a topic capped at one
    record, fed batches of 1,000, held 1,000 records' bodies per partition). Written at once, in a
    batch of its own: the store is local, nothing replicated depends on it."""
    for key, raw in _values(store, tid, partition, before, 1):
        try:
            value = _decode(key, raw)
        except _Damaged:
            return
        if value.first >= before:
            return
        kept = list(read(store, tid, partition, before, value.last + 1))
        if any(entry.error for entry in kept) or [e.offset for e in kept] != list(range(before, value.last + 1)):
            return  # not as written: left as it is (filtered on read)
        batch = store.batch()
        for ts, run in groupby(kept, key=lambda entry: entry.timestamp_ms):
            entries = list(run)
            append(batch, tid, partition, entries[0].offset, ts, [entry.body for entry in entries])
        store.write(batch)


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
