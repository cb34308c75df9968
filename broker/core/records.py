"""Record keys, the stored record frame, and position tokens.

Record key: ``>IIQ`` = (topic_id, partition, offset), big-endian so a range scan is a seek.
Record frame: 13 bytes ``>IqB`` = (crc32c, timestamp_ms, format) followed by a serialized
``RecordBody``. The CRC32C covers the record's 16-byte key, the timestamp, the format byte and the
body, so a record that is corrupted or stored at the wrong offset is detected on read. Frames are
stored several to a value, one value per applied batch: ``broker.core.record_log`` owns that
format and every read of it.
Position token: ``>BIIQ`` = (version, incarnation, partition, next offset): resuming from it
continues right after the record that carried it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from broker.core.errors import InvalidArgument

RECORD_KEY = struct.Struct(">IIQ")
FRAME = struct.Struct(">IqB")
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
    """The frame of ``body`` as the record at ``key`` (stored inside a batch: ``broker.core.record_log``)."""
    tail = FRAME.pack(0, timestamp_ms, FORMAT_V1)[4:] + body
    crc = google_crc32c.extend(google_crc32c.value(key), tail)
    return struct.pack(">I", crc) + tail


def position_token(incarnation: int, partition: int, next_offset: int) -> bytes:
    """The encoded :class:`PositionToken` without building one (the read path calls it per record)."""
    return _TOKEN.pack(TOKEN_V1, incarnation, partition, next_offset)


@dataclass(frozen=True, slots=True)
class PositionToken:
    incarnation: int
    partition: int
    next_offset: int

    def encode(self) -> bytes:
        return position_token(self.incarnation, self.partition, self.next_offset)

    @staticmethod
    def decode(token: bytes) -> PositionToken:
        if len(token) != _TOKEN.size:
            raise InvalidArgument(f"position token must be {_TOKEN.size} bytes, got {len(token)}")
        version, incarnation, partition, next_offset = _TOKEN.unpack(token)
        if version != TOKEN_V1:
            raise InvalidArgument(f"unknown position token version {version}")
        return PositionToken(incarnation, partition, next_offset)


FRAME_BYTES = FRAME.size
TOKEN_BYTES = _TOKEN.size
