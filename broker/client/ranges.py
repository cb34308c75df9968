"""Bounded reads for batch jobs (Spark, archives): one partition's offset range, per-partition
end offsets, and the offset a timestamp maps to, for :class:`broker.client.Client`.

Contract of :meth:`RangesMixin.read_range` (and of :meth:`RangesMixin.read_range_batches`, the same
as :class:`Batch` values): the records of ``[start, end)`` of one partition in offset order, each
once, and every hole in that range reported as a :class:`MissingRange` in its place (pruned or
expired records, a ``badmsg``): a batch reader can never lose a record silently.

The asyncio SDK reads ranges with the same code: :class:`RangeCut` turns what a subscription from
``start`` delivers into what the range yields, and :func:`end_offsets_of` / :func:`timestamp_end`
shape and check what ``describe_topic`` says; each client only iterates (``for`` or ``async for``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from broker.client.errors import invalid_argument
from broker.client.models import Batch, Event, Record, TopicInfo
from broker.client.subscription import BatchSubscription, Subscription

READ_RANGE_BATCH_MAX = 1000  # records per Subscribe response the range reader asks for


@dataclass(frozen=True)
class MissingRange:
    """Offsets ``[start, end)`` of ``partition`` were asked for and are not in the log (pruned,
    expired, cleared or undecodable); ``reason`` is the event that said so, or "gap"."""

    topic: str
    partition: int
    start: int
    end: int
    reason: str

    def __str__(self) -> str:
        return (f"topic {self.topic!r} partition {self.partition}: offsets [{self.start}, {self.end}) "
                f"are no longer in the log ({self.reason})")


def check_range(partition: int, start: int, end: int) -> None:
    if partition < 0 or start < 0 or end < start:
        raise invalid_argument(f"need partition >= 0 and 0 <= start <= end, got {partition}, {start}, {end}")


def end_offsets_of(info: TopicInfo) -> dict[int, tuple[int, int]]:
    """``{partition: (start_offset, end_offset)}`` of a description, every partition present."""
    found = {p.partition: (p.start_offset, p.end_offset) for p in info.partitions}
    return {p: found.get(p, (0, 0)) for p in range(info.partition_count)}


def check_timestamp_lookup(partition: int, timestamp_ms: int) -> None:
    if partition < 0 or timestamp_ms < 0:
        raise invalid_argument(f"partition and timestamp_ms must be >= 0, got {partition}, {timestamp_ms}")


def timestamp_end(offsets: dict[int, tuple[int, int]], topic: str, partition: int) -> int:
    """The end offset of ``partition`` in ``offsets`` (what ``offset_for_timestamp`` answers when no
    record is that recent); InvalidArgument when the topic has no such partition."""
    if partition not in offsets:
        raise invalid_argument(f"topic {topic!r} has no partition {partition}")
    return offsets[partition][1]


class RangeCut:
    """What :meth:`RangesMixin.read_range` (``record``) or ``read_range_batches`` (``batch``) yields
    for each item of a ``stop_at_end`` subscription of ``partition`` from ``start``: the records of
    ``[start, end)``, each once, and a :class:`MissingRange` in place of each hole; :meth:`rest`
    reports what the stream never reached. Stop reading once :attr:`done`."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        check_range(partition, start, end)
        self.topic, self.partition, self.end = topic, partition, end
        self.expected = start  # the next offset the range yields
        self.reason = "gap"  # why the next hole is one: the last event's type, if one came
        self.done = start >= end

    def _hole_before(self, first: int) -> list[MissingRange]:
        """The hole from the next expected offset to ``first``, if there is one (cut at ``end``)."""
        if first <= self.expected:
            return []
        hole = MissingRange(self.topic, self.partition, self.expected, min(first, self.end), self.reason)
        self.reason, self.expected = "gap", min(first, self.end)
        return [hole]

    def record(self, item: Record | Event) -> list[Record | MissingRange]:
        if isinstance(item, Event):
            self.reason = item.type
            return []
        if item.offset < self.expected:
            return []  # a resumed stream may repeat; each record is given once
        out: list[Record | MissingRange] = list(self._hole_before(item.offset))
        if item.offset >= self.end:
            self.done = True
            return out
        out.append(item)
        self.expected = item.offset + 1
        self.done = self.expected >= self.end
        return out

    def batch(self, item: Batch | Event) -> list[Batch | MissingRange]:
        if isinstance(item, Event):
            self.reason = item.type
            return []
        first = item.first_offset
        if item.next_offset <= self.expected:
            return []  # a resumed stream may repeat; each record is given once
        out: list[Batch | MissingRange] = list(self._hole_before(first))
        if first >= self.end:
            self.done = True
            return out
        lo, hi = self.expected - first, min(item.next_offset, self.end) - first
        out.append(item if (lo, hi) == (0, len(item)) else item.slice(lo, hi))
        self.expected = first + hi
        self.done = self.expected >= self.end
        return out

    def rest(self) -> list[MissingRange]:
        """The hole at the end: offsets up to ``end`` the stream did not deliver."""
        if self.expected >= self.end:
            return []
        return [MissingRange(self.topic, self.partition, self.expected, self.end, self.reason)]


class RangesMixin:
    """Methods of :class:`~broker.client.Client` that read bounded parts of a topic."""

    describe_topic: Callable[[str], TopicInfo]
    subscribe: Callable[..., Subscription]
    subscribe_batches: Callable[..., BatchSubscription]

    def end_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (start_offset, end_offset)}``: each partition's retained range now (the
        end is the offset the next record will get). Raises ``TopicNotFound``."""
        return end_offsets_of(self.describe_topic(topic))

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The offset of the first record of ``partition`` stored at or after ``timestamp_ms``, or
        the partition's end offset when there is none yet (a reader starting there sees only newer
        records)."""
        check_timestamp_lookup(partition, timestamp_ms)
        end = timestamp_end(self.end_offsets(topic), topic, partition)
        with self.subscribe(topic, partition=partition, timestamp_ms=timestamp_ms, stop_at_end=True,
                            max_batch=1) as items:
            for item in items:
                if isinstance(item, Record):
                    return item.offset
        return end

    def read_range(self, topic: str, partition: int, start: int, end: int) -> Iterator[Record | MissingRange]:
        """Records of offsets ``[start, end)`` of ``partition`` in order, with a
        :class:`MissingRange` in place of each hole (see the module contract). ``end`` must not
        exceed the partition's end offset when called (offsets beyond it are not waited for: the
        read stops at the log end and reports the rest missing)."""
        cut = RangeCut(topic, partition, start, end)
        if cut.done:
            return
        with self.subscribe(topic, partition=partition, start=start, stop_at_end=True,
                            max_batch=READ_RANGE_BATCH_MAX) as items:
            for item in items:
                yield from cut.record(item)
                if cut.done:
                    break
        yield from cut.rest()

    def read_range_batches(self, topic: str, partition: int, start: int, end: int) -> Iterator[Batch | MissingRange]:
        """:meth:`read_range` with the records as :class:`Batch` values (``subscribe_batches``,
        cut to the range; a cut batch's ``next_position`` is empty): the same records and holes,
        without an object per record."""
        cut = RangeCut(topic, partition, start, end)
        if cut.done:
            return
        with self.subscribe_batches(topic, partition=partition, start=start, stop_at_end=True,
                                    max_batch=READ_RANGE_BATCH_MAX) as items:
            for item in items:
                yield from cut.batch(item)
                if cut.done:
                    break
        yield from cut.rest()
