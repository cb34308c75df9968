"""Bounded reads for batch jobs (Spark, archives): one partition's offset range, per-partition
end offsets, and the offset a timestamp maps to, for :class:`broker.client.Client`.

Contract of :meth:`RangesMixin.read_range` (and of :meth:`RangesMixin.read_range_batches`, the same
as :class:`Batch` values): the records of ``[start, end)`` of one partition in offset order, each
once, and every hole in that range reported as a :class:`MissingRange` in its place (pruned or
expired records, a ``badmsg``): a batch reader can never lose a record silently.
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


class RangesMixin:
    """Methods of :class:`~broker.client.Client` that read bounded parts of a topic."""

    describe_topic: Callable[[str], TopicInfo]
    subscribe: Callable[..., Subscription]
    subscribe_batches: Callable[..., BatchSubscription]

    def end_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (start_offset, end_offset)}``: each partition's retained range now (the
        end is the offset the next record will get). Raises ``TopicNotFound``."""
        info = self.describe_topic(topic)
        found = {p.partition: (p.start_offset, p.end_offset) for p in info.partitions}
        return {p: found.get(p, (0, 0)) for p in range(info.partition_count)}

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The offset of the first record of ``partition`` stored at or after ``timestamp_ms``, or
        the partition's end offset when there is none yet (a reader starting there sees only newer
        records)."""
        if partition < 0 or timestamp_ms < 0:
            raise invalid_argument(f"partition and timestamp_ms must be >= 0, got {partition}, {timestamp_ms}")
        offsets = self.end_offsets(topic)
        if partition not in offsets:
            raise invalid_argument(f"topic {topic!r} has no partition {partition}")
        end = offsets[partition][1]
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
        _check_range(partition, start, end)
        if start == end:
            return
        expected = start
        reason = "gap"
        with self.subscribe(topic, partition=partition, start=start, stop_at_end=True,
                            max_batch=READ_RANGE_BATCH_MAX) as items:
            for item in items:
                if isinstance(item, Event):
                    reason = item.type
                    continue
                if item.offset < expected:
                    continue  # a resumed stream may repeat; each record is given once
                if item.offset > expected:
                    yield MissingRange(topic, partition, expected, min(item.offset, end), reason)
                    reason = "gap"
                    expected = min(item.offset, end)
                if item.offset >= end:
                    break
                yield item
                expected = item.offset + 1
                if expected >= end:
                    break
        if expected < end:
            yield MissingRange(topic, partition, expected, end, reason)

    def read_range_batches(self, topic: str, partition: int, start: int, end: int) -> Iterator[Batch | MissingRange]:
        """:meth:`read_range` with the records as :class:`Batch` values (``subscribe_batches``,
        cut to the range; a cut batch's ``next_position`` is empty): the same records and holes,
        without an object per record."""
        _check_range(partition, start, end)
        if start == end:
            return
        expected = start
        reason = "gap"
        with self.subscribe_batches(topic, partition=partition, start=start, stop_at_end=True,
                                    max_batch=READ_RANGE_BATCH_MAX) as items:
            for item in items:
                if isinstance(item, Event):
                    reason = item.type
                    continue
                first = item.first_offset
                if item.next_offset <= expected:
                    continue  # a resumed stream may repeat; each record is given once
                if first > expected:
                    yield MissingRange(topic, partition, expected, min(first, end), reason)
                    reason = "gap"
                    expected = min(first, end)
                if first >= end:
                    break
                lo, hi = expected - first, min(item.next_offset, end) - first
                yield item if (lo, hi) == (0, len(item)) else item.slice(lo, hi)
                expected = first + hi
                if expected >= end:
                    break
        if expected < end:
            yield MissingRange(topic, partition, expected, end, reason)


def _check_range(partition: int, start: int, end: int) -> None:
    if partition < 0 or start < 0 or end < start:
        raise invalid_argument(f"need partition >= 0 and 0 <= start <= end, got {partition}, {start}, {end}")
