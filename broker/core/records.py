"""Record keys, the stored record frame, and position tokens.

Stored key: ``>IIQ`` = (topic_id, partition, offset), big-endian so a range scan is a seek.
Stored value: a 13-byte frame ``>IqB`` = (crc32c, timestamp_ms, format) followed by a serialized
``RecordBody``. The CRC32C covers the 16-byte key, the timestamp, the format byte and the body,
so a record that is corrupted or stored under the wrong key is detected on read.
Position token: ``>BIIQ`` = (version, incarnation, partition, next offset): resuming from it
continues right after the record that carried it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from broker.core.errors import InvalidArgument
from broker.storage import Column, Store

RECORD_KEY = struct.Struct(">IIQ")
_FRAME = struct.Struct(">IqB")
_TOKEN = struct.Struct(">BIIQ")
FORMAT_V1 = 1
TOKEN_V1 = 1
MAX_OFFSET = 2**64 - 1


def record_key(topic_id: int, partition: int, offset: int) -> bytes:
    return RECORD_KEY.pack(topic_id, partition, offset)


def topic_range(topic_id: int) -> tuple[bytes, bytes]:
    """Every record key of a topic: ``[begin, end)``."""
    return RECORD_KEY.pack(topic_id, 0, 0), RECORD_KEY.pack(topic_id + 1, 0, 0)


def frame(key: bytes, timestamp_ms: int, body: bytes) -> bytes:
    """The stored value for ``body`` under ``key``."""
    tail = _FRAME.pack(0, timestamp_ms, FORMAT_V1)[4:] + body
    crc = google_crc32c.extend(google_crc32c.value(key), tail)
    return struct.pack(">I", crc) + tail


class CorruptRecord(Exception):
    """A stored value failed its checksum or cannot be decoded."""


@dataclass(frozen=True, slots=True)
class StoredRecord:
    partition: int
    offset: int
    timestamp_ms: int
    body: bytes  # serialized RecordBody


def unframe(key: bytes, value: bytes) -> StoredRecord:
    """Check and split a stored value; raises :class:`CorruptRecord`."""
    if len(value) < _FRAME.size or len(key) != RECORD_KEY.size:
        raise CorruptRecord(f"stored value of {len(value)} bytes is shorter than its frame")
    crc, timestamp_ms, fmt = _FRAME.unpack_from(value)
    if google_crc32c.extend(google_crc32c.value(key), value[4:]) != crc:
        raise CorruptRecord("checksum mismatch")
    if fmt != FORMAT_V1:
        raise CorruptRecord(f"unknown record format {fmt}")
    _, partition, offset = RECORD_KEY.unpack(key)
    return StoredRecord(partition, offset, timestamp_ms, value[_FRAME.size:])


def frame_timestamp(value: bytes) -> int:
    """The timestamp of a stored value without checking it (for time-index searches)."""
    return int(_FRAME.unpack_from(value)[1])


@dataclass(frozen=True, slots=True)
class PositionToken:
    incarnation: int
    partition: int
    next_offset: int

    def encode(self) -> bytes:
        return _TOKEN.pack(TOKEN_V1, self.incarnation, self.partition, self.next_offset)

    @staticmethod
    def decode(token: bytes) -> PositionToken:
        if len(token) != _TOKEN.size:
            raise InvalidArgument(f"position token must be {_TOKEN.size} bytes, got {len(token)}")
        version, incarnation, partition, next_offset = _TOKEN.unpack(token)
        if version != TOKEN_V1:
            raise InvalidArgument(f"unknown position token version {version}")
        return PositionToken(incarnation, partition, next_offset)


FRAME_BYTES = _FRAME.size


def offset_for_time(store: Store, topic_id: int, partition: int, timestamp_ms: int, lo: int, hi: int) -> int:
    """First offset in ``[lo, hi)`` whose timestamp is >= ``timestamp_ms`` (``hi`` if none). A binary
    search: it relies on timestamps never decreasing within a partition, which the state machine's
    log-append time guarantees (``max(leader now_ms, previous timestamp)`` at apply, whatever the
    leaders' clocks do). Subscribing from a timestamp and retention by age both use it. A missing
    record counts as older."""
    while lo < hi:
        mid = (lo + hi) // 2
        value = store.get(Column.RECORDS, record_key(topic_id, partition, mid))
        if value is None or frame_timestamp(value) < timestamp_ms:
            lo = mid + 1
        else:
            hi = mid
    return lo
