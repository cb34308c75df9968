"""Stateless reads answered as bytes: a response of stored records built without a protobuf object
per record (issue 15: consume throughput).

A serialized ``Record`` here is what only the reader knows, topic (1), partition (2), offset (3),
timestamp_ms (7) and the position token (12), followed by the stored body (a ``RecordBody``: fields
4-11, numbered as in ``Record``). Protobuf parses concatenated fields as one message, so
``head + body`` reads as the record that ``record_log.parse_into`` fills (the body merged, then
those five fields set): a stored body never carries fields 1, 2, 3, 7 or 12 (``RecordBody`` has
none, and the leader stores only bodies it serialized or proved to be one). A response is field 1
(``batch``) of ``SubscribeResponse`` holding field 1 (``records``) of ``RecordBatch`` once per
record, each length-delimited. The internal and public twins share these numbers
(``tests/core/test_internal_wire.py``), so the bytes are a public response as they stand.

A compact response (``SubscribeRequest.compact``: field 3, ``CompactBatch``, of ``SubscribeResponse``)
is cheaper still: its records are the stored bodies as they are (field 1 once per record, each
length-delimited, no per-record head), and what only the reader knows is written once after them:
topic (2), partition (3), first offset (4), the timestamps in runs (5 and 6, packed) and the
position token after the last record (7). :class:`CompactWriter` builds it.

Before a response leaves, ``finish`` (either writer) parses it once, in C, as
``read_view.proto``'s ``SubscribeResponseView``: the internal twin's fields, with the records
parsed as one merged message, which checks each of them as the twin would (the tests compare the
two on damaged bodies) without a message object per record. Each body is the last thing inside its
record's length, so the parse fails if any body does not parse on its own (a field running past the
body's end runs past the record's). A response that does not parse is not sent (``finish`` answers
None): the reader reads those records again the per-record way, which reports an unreadable one as
BADMSG, as it always did. So a stored body that passed its CRC but is not a ``RecordBody`` (written
by a faulty leader) still costs a reader one record, never the stream. Nothing is read out of the
parse: the metrics count a response's bytes (``len(data)``), not its values', which would take a
bytes object per value (a catching-up reader of 1 KiB records read 6-13 % faster without them;
bench/NOTE.md, 2026-12-06).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from broker.core import records
from broker.core.record_log import Entry, Span
from broker.protowire import varint
from broker.v1 import read_view_pb2

_U64 = (1 << 64) - 1
_FIELD1_BYTES = b"\x0a"  # field 1, length-delimited: SubscribeResponse.batch, RecordBatch.records, CompactBatch.records
_COMPACT = b"\x1a"  # SubscribeResponse.compact: field 3, length-delimited
_OFFSET = b"\x18"  # Record.offset: field 3, varint
_TIMESTAMP = b"\x38"  # Record.timestamp_ms: field 7, varint
_POSITION = b"\x62" + bytes([records.TOKEN_BYTES])  # Record.position: field 12, length-delimited


def _string_field(number: int, text: str) -> bytes:
    return _bytes_field(number, text.encode())


def _bytes_field(number: int, data: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(data)) + data


def _packed_field(number: int, values: list[int]) -> bytes:
    """A packed repeated varint field (uint32, or int64 given as its two's complement)."""
    return _bytes_field(number, b"".join(map(varint, values)))


def _checked(data: bytes, count: int) -> PackedBatch | None:
    """``data``, of ``count`` records, as a :class:`PackedBatch` once it parses (as
    ``read_view.proto``'s view, in C); None when it does not (a stored body that is not a
    ``RecordBody``)."""
    try:
        read_view_pb2.SubscribeResponseView.FromString(data)
    except DecodeError:
        return None
    return PackedBatch(data, count)


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """One serialized ``SubscribeResponse`` holding a batch of ``records`` records."""

    data: bytes
    records: int


class BatchWriter:
    """Builds one response from consecutive records of one partition: :meth:`take` from a scan,
    then :meth:`finish`."""

    def __init__(self, topic: str, topic_id: int, partition: int, first_offset: int) -> None:
        self._head = _string_field(1, topic) + (b"\x10" + varint(partition) if partition else b"")
        self._topic_id = topic_id
        self._partition = partition
        self._first = first_offset
        self._parts: list[bytes] = []
        self.count = 0
        self.size = 0  # record bytes so far, with the per-record framing allowance

    @property
    def next_offset(self) -> int:
        return self._first + self.count

    def take(self, scan: Iterator[Entry], bytes_max: int, framing_bytes: int) -> Entry | None:
        """Add records from ``scan`` while each is the next offset, readable, and fits: a record
        joins when the response is empty or ``size + its bytes + framing_bytes <= bytes_max``
        (``reading.fits``). Returns the first entry that is not the next readable offset, for the
        caller to report; None when the scan ended or a record did not fit (the next read starts
        with it). One loop with everything local: the per-record cost of every stateless read."""
        head, tid, p, token, parts = self._head, self._topic_id, self._partition, records.position_token, self._parts
        count, size, expected = self.count, self.size, self._first + self.count
        last_ts: int | None = None
        ts_field = b""
        stopped: Entry | None = None
        for entry in scan:
            offset, timestamp_ms, body, error = entry
            if error is not None or offset != expected:
                stopped = entry
                break
            if timestamp_ms != last_ts:  # one applied batch shares one timestamp
                last_ts = timestamp_ms
                ts_field = _TIMESTAMP + varint(timestamp_ms & _U64) if timestamp_ms else b""
            record = b"".join((head, _OFFSET, varint(offset), ts_field, _POSITION, token(tid, p, offset + 1), body))
            n = len(record)
            if count and size + n + framing_bytes > bytes_max:
                break
            parts += (_FIELD1_BYTES, varint(n), record)
            count += 1
            size += n + framing_bytes
            expected += 1
        self.count, self.size = count, size
        return stopped

    def finish(self) -> PackedBatch | None:
        """The response, or None when it does not parse (a body that is not a ``RecordBody``)."""
        assert self.count > 0, "a packed response holds at least one record"
        parts = self._parts
        return _checked(b"".join((_FIELD1_BYTES, varint(sum(map(len, parts))), *parts)), self.count)


class CompactWriter:
    """Builds one ``CompactBatch`` response from consecutive records of one partition: the same
    :meth:`take` contract as :class:`BatchWriter`; a record's bytes are its body's."""

    def __init__(self, topic: str, topic_id: int, partition: int, first_offset: int) -> None:
        self._topic = topic
        self._topic_id = topic_id
        self._partition = partition
        self._first = first_offset
        self._parts: list[bytes] = []
        self._counts: list[int] = []  # timestamp runs: how many records ...
        self._stamps: list[int] = []  # ... have this timestamp (two's complement, as the wire has it)
        self.count = 0
        self.size = 0  # element bytes so far, with the per-record framing allowance

    @property
    def next_offset(self) -> int:
        return self._first + self.count

    def take(self, scan: Iterator[Entry | Span], bytes_max: int, framing_bytes: int) -> Iterator[Entry] | None:
        """:meth:`BatchWriter.take` for a compact response, from :func:`record_log.read_spans`: a
        :class:`Span` (intact stored records, already elements of field 1) joins as one slice, as
        many of its records as fit; an :class:`Entry` writes its body's length and the body. A
        record counts as its element's bytes plus ``framing_bytes``. Returns the records from the
        first one that is not the next readable offset on, as entries, for the caller to report."""
        parts, counts, stamps = self._parts, self._counts, self._stamps
        count, size, expected = self.count, self.size, self._first + self.count
        last_ts = stamps[-1] if stamps else None
        run = 0  # records added to the current run by this call
        stopped: Iterator[Entry] | None = None
        for item in scan:
            if isinstance(item, Span):
                if item.first != expected:
                    stopped = item.entries()
                    break
                k = item.fitting(bytes_max - size, framing_bytes)
                if k == 0 and not count:
                    k = 1  # a lone record always goes
                if k:
                    if run:
                        counts[-1] += run
                        run = 0
                    for n, ts in item.runs(k):
                        ts &= _U64
                        if ts == last_ts:
                            counts[-1] += n
                        else:
                            counts.append(n)
                            stamps.append(ts)
                            last_ts = ts
                    parts.append(item.elements(k))
                    count += k
                    size += item.element_bytes(k) + framing_bytes * k
                    expected += k
                if k < item.count:
                    break
                continue
            offset, timestamp_ms, body, error = item
            if error is not None or offset != expected:
                stopped = iter((item,))
                break
            n = len(body)
            head = varint(n)
            if count and size + 1 + len(head) + n + framing_bytes > bytes_max:
                break
            timestamp_ms &= _U64
            if timestamp_ms != last_ts:  # one applied batch shares one timestamp
                if run:
                    counts[-1] += run
                counts.append(0)
                stamps.append(timestamp_ms)
                last_ts, run = timestamp_ms, 0
            parts += (_FIELD1_BYTES, head, body)
            run += 1
            count += 1
            size += 1 + len(head) + n + framing_bytes
            expected += 1
        if run:
            counts[-1] += run
        self.count, self.size = count, size
        return stopped

    def finish(self) -> PackedBatch | None:
        """The response, or None when it does not parse (a body that is not a ``RecordBody``)."""
        assert self.count > 0, "a packed response holds at least one record"
        p, first = self._partition, self._first
        tail = b"".join((
            _string_field(2, self._topic),
            b"\x18" + varint(p) if p else b"",
            b"\x20" + varint(first) if first else b"",
            _packed_field(5, self._counts),
            _packed_field(6, self._stamps),
            _bytes_field(7, records.position_token(self._topic_id, p, first + self.count)),
        ))
        parts = self._parts
        parts.append(tail)
        return _checked(b"".join((_COMPACT, varint(sum(map(len, parts))), *parts)), self.count)
