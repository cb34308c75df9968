""":class:`broker.client.ranges.RangeCut`, what both SDKs' ``read_range`` and ``read_range_batches``
yield for what a subscription delivers: each record of the range once, every hole in its place,
including the cases a cluster test cannot force at will (a resumed stream repeating records, an
event before a hole, a batch straddling either end)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from broker.client import Batch, Event, InvalidArgument, MissingRange, Record
from broker.client.ranges import RangeCut

pytestmark = pytest.mark.unit

T = "t"


def record(offset: int) -> Record:
    return Record(T, 0, offset, None, b"v%d" % offset, {}, 0, b"")


def batch(first: int, count: int) -> Batch:
    return Batch(T, 0, first, [b"v%d" % o for o in range(first, first + count)], [0] * count, b"next",
                 [None] * count)


def offsets_and_holes(items: Sequence[object]) -> list[object]:
    out: list[object] = []
    for item in items:
        if isinstance(item, Record):
            out.append(item.offset)
        elif isinstance(item, Batch):
            out.append(list(item.offsets))
        else:
            out.append(item)
    return out


def test_records_repeated_by_a_resumed_stream_are_given_once_and_holes_in_place() -> None:
    cut = RangeCut(T, 0, 3, 10)
    out: list[object] = []
    skip = Event("skip_forward", T, 0, 4, 6)
    items: list[Record | Event] = [record(3), record(4), record(3), record(4), skip, record(6), record(9)]
    for item in items:
        assert not cut.done
        out += cut.record(item)
    assert cut.done and cut.rest() == []
    assert offsets_and_holes(out) == [3, 4, MissingRange(T, 0, 5, 6, "skip_forward"), 6,
                                      MissingRange(T, 0, 7, 9, "gap"), 9]


def test_a_stream_that_ends_early_leaves_the_rest_missing() -> None:
    cut = RangeCut(T, 0, 0, 5)
    assert offsets_and_holes(cut.record(record(0))) == [0]
    assert cut.record(Event("reset", T, 0, 1, 1)) == []
    assert not cut.done and cut.rest() == [MissingRange(T, 0, 1, 5, "reset")]


def test_a_record_past_the_end_closes_the_range_with_the_hole_before_it() -> None:
    cut = RangeCut(T, 0, 0, 3)
    assert cut.record(record(7)) == [MissingRange(T, 0, 0, 3, "gap")]
    assert cut.done and cut.rest() == []


def test_batches_are_cut_to_the_range_and_repeats_dropped() -> None:
    cut = RangeCut(T, 0, 2, 9)
    out: list[Batch | MissingRange] = []
    for item in [batch(0, 4), batch(0, 4), batch(6, 5)]:
        out += cut.batch(item)
    assert cut.done
    assert offsets_and_holes(out) == [[2, 3], MissingRange(T, 0, 4, 6, "gap"), [6, 7, 8]]
    positions = [b.next_position for b in out if isinstance(b, Batch)]
    assert positions == [b"next", b""], "a batch cut at its end has no position to resume from"


def test_an_empty_range_is_done_at_once_and_a_backwards_one_refused() -> None:
    assert RangeCut(T, 0, 5, 5).done
    with pytest.raises(InvalidArgument, match="need partition >= 0 and 0 <= start <= end, got 0, 5, 2"):
        RangeCut(T, 0, 5, 2)
