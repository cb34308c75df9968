"""Position tokens: version 1 (a position) and version 2 (a group delivery's: the position and the delivery)."""

from __future__ import annotations

import struct

import pytest

from broker.core.errors import InvalidArgument
from broker.core.records import PositionToken, position_token

pytestmark = pytest.mark.unit


def test_both_versions_round_trip_and_a_delivery_is_dropped_where_a_position_is_resumed_from() -> None:
    plain = PositionToken(7, 2, 100)
    assert plain.encode() == position_token(7, 2, 100) and len(plain.encode()) == 17
    assert PositionToken.decode(plain.encode()) == plain
    delivered = PositionToken(7, 2, 100, 2**64 - 1)
    assert len(delivered.encode()) == 25
    assert PositionToken.decode(delivered.encode()) == delivered
    assert delivered.resumable() == plain


@pytest.mark.parametrize(("token", "message"), [
    (b"", "must be 17 or 25 bytes, got 0"),
    (b"\x01" * 18, "must be 17 or 25 bytes, got 18"),
    (struct.pack(">BIIQ", 2, 7, 0, 1), "unknown position token version 2"),
    (struct.pack(">BIIQQ", 1, 7, 0, 1, 5), "unknown position token version 1"),
    (struct.pack(">BIIQQ", 2, 7, 0, 1, 0), "version 2 without a delivery"),
])
def test_a_malformed_token_is_refused(token: bytes, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        PositionToken.decode(token)
