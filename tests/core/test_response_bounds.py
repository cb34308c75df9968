"""Byte bounds of stream responses (``broker.leader.reading.fits``, ``broker.leader.groups.delivery.chunks``)."""

from __future__ import annotations

import pytest

from broker.leader.groups.delivery import chunks
from broker.leader.reading import RECORD_FRAMING_BYTES, fits
from broker.v1 import common_pb2

pytestmark = pytest.mark.unit


def record(size: int) -> common_pb2.Record:
    return common_pb2.Record(value=b"v" * size)


def test_a_lone_record_always_fits_and_the_bound_holds_otherwise() -> None:
    assert fits(0, 10 << 20, 0, 1 << 20)  # larger than the bound, but alone
    assert fits(100, 1000 - 100 - RECORD_FRAMING_BYTES, 1, 1000)
    assert not fits(100, 1000 - 100 - RECORD_FRAMING_BYTES + 1, 1, 1000)


def test_chunks_keep_order_and_respect_count_and_bytes() -> None:
    sizes = [1, 5000, 20_000, 1, 300_000, 1 << 20, 7, 7, 7, 900_000, 2]
    rows = [record(s) for s in sizes]
    bytes_max = 1 << 20
    cut = list(chunks(rows, 3, bytes_max))
    assert [r for c in cut for r in c] == rows
    for c in cut:
        assert 1 <= len(c) <= 3
        total = sum(r.ByteSize() + RECORD_FRAMING_BYTES for r in c)
        assert len(c) == 1 or total <= bytes_max, [r.ByteSize() for r in c]
