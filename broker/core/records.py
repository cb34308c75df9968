"""Record keys, the stored record frame, and position tokens.

Record key: ``>IIQ`` = (topic_id, partition, offset), big-endian so a range scan is a seek.
Record frame: 13 bytes ``>IqB`` = (crc32c, timestamp_ms, format) followed by a serialized
``RecordBody``. The CRC32C covers the record's 16-byte key, the timestamp, the format byte and the
body, so a record that is corrupted or stored at the wrong offset is detected on read. Frames are
stored several to a value, one value per applied batch: ``broker.core.record_log`` owns that
format and every read of it.
Position token: ``>BIIQ`` = (version 1, incarnation, partition, next offset): resuming from it
continues right after the record that carried it. A record a consumer group delivers carries
version 2, ``>BIIQQ``: the same and the delivery (the lease it was handed out under, a number the
leader gives each lease), so a nack, release or extend from a delivery whose lease has ended
cannot touch the record's next delivery (``broker/leader/groups/service.py``). Everything that
takes a position token takes both; where a position is resumed from, the delivery is ignored.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from broker.core.errors import InvalidArgument

RECORD_KEY = struct.Struct(">IIQ")
FRAME = struct.Struct(">IqB")
_TOKEN = struct.Struct(">BIIQ")
_DELIVERY_TOKEN = struct.Struct(">BIIQQ")
FORMAT_V1 = 1
TOKEN_V1 = 1
TOKEN_V2 = 2  # with the delivery
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
    delivery: int = 0  # the group delivery that handed the record out (version 2); 0: none (version 1)

    def encode(self) -> bytes:
        if self.delivery:
            return _DELIVERY_TOKEN.pack(TOKEN_V2, self.incarnation, self.partition, self.next_offset, self.delivery)
        return position_token(self.incarnation, self.partition, self.next_offset)

    def resumable(self) -> PositionToken:
        """The same position without its delivery (what a stored start position keeps)."""
        return PositionToken(self.incarnation, self.partition, self.next_offset)

    @staticmethod
    def decode(token: bytes) -> PositionToken:
        if len(token) == _TOKEN.size:
            version, incarnation, partition, next_offset = _TOKEN.unpack(token)
            delivery, expected = 0, TOKEN_V1
        elif len(token) == _DELIVERY_TOKEN.size:
            version, incarnation, partition, next_offset, delivery = _DELIVERY_TOKEN.unpack(token)
            expected = TOKEN_V2
        else:
            raise InvalidArgument(f"position token must be {_TOKEN.size} or {_DELIVERY_TOKEN.size} bytes, "
                                  f"got {len(token)}")
        if version != expected:
            raise InvalidArgument(f"unknown position token version {version}")
        if version == TOKEN_V2 and delivery == 0:
            raise InvalidArgument("position token of version 2 without a delivery")
        return PositionToken(incarnation, partition, next_offset, delivery)


FRAME_BYTES = FRAME.size
TOKEN_BYTES = _TOKEN.size
