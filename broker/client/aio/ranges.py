"""Bounded reads for :class:`broker.client.aio.AsyncClient`: one partition's offset range, the end
offsets, the offset of a timestamp. The contract of :mod:`broker.client.ranges` (every hole of a
range is reported as a :class:`MissingRange` in its place), with its code: :class:`RangeCut` cuts
what an ``async for`` over a subscription delivers.

``read_range`` and ``read_range_batches`` are async generators: one left before its end keeps its
subscription open until it is closed (``await it.aclose()``, or ``contextlib.aclosing``) or
collected."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from broker.client.aio.streams import AsyncBatchSubscription, AsyncSubscription
from broker.client.models import Batch, Record, TopicInfo
from broker.client.ranges import (
    READ_RANGE_BATCH_MAX,
    MissingRange,
    RangeCut,
    check_timestamp_lookup,
    end_offsets_of,
    timestamp_end,
)


class AsyncRangesMixin:
    """Methods of :class:`~broker.client.aio.AsyncClient` that read bounded parts of a topic."""

    describe_topic: Callable[[str], Awaitable[TopicInfo]]
    subscribe: Callable[..., AsyncSubscription]
    subscribe_batches: Callable[..., AsyncBatchSubscription]

    async def end_offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """``{partition: (start_offset, end_offset)}``: each partition's retained range now (the
        end is the offset the next record will get). Raises ``TopicNotFound``."""
        return end_offsets_of(await self.describe_topic(topic))

    async def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The offset of the first record of ``partition`` stored at or after ``timestamp_ms``, or
        the partition's end offset when there is none yet."""
        check_timestamp_lookup(partition, timestamp_ms)
        end = timestamp_end(await self.end_offsets(topic), topic, partition)
        async with self.subscribe(topic, partition=partition, timestamp_ms=timestamp_ms, stop_at_end=True,
                                  max_batch=1) as items:
            async for item in items:
                if isinstance(item, Record):
                    return item.offset
        return end

    async def read_range(self, topic: str, partition: int, start: int, end: int
                         ) -> AsyncIterator[Record | MissingRange]:
        """Records of offsets ``[start, end)`` of ``partition`` in order, with a
        :class:`MissingRange` in place of each hole (:meth:`broker.client.Client.read_range`)."""
        cut = RangeCut(topic, partition, start, end)
        if cut.done:
            return
        async with self.subscribe(topic, partition=partition, start=start, stop_at_end=True,
                                  max_batch=READ_RANGE_BATCH_MAX) as items:
            async for item in items:
                for out in cut.record(item):
                    yield out
                if cut.done:
                    break
        for hole in cut.rest():
            yield hole

    async def read_range_batches(self, topic: str, partition: int, start: int, end: int
                                 ) -> AsyncIterator[Batch | MissingRange]:
        """:meth:`read_range` with the records as :class:`Batch` values
        (:meth:`broker.client.Client.read_range_batches`)."""
        cut = RangeCut(topic, partition, start, end)
        if cut.done:
            return
        async with self.subscribe_batches(topic, partition=partition, start=start, stop_at_end=True,
                                          max_batch=READ_RANGE_BATCH_MAX) as items:
            async for item in items:
                for out in cut.batch(item):
                    yield out
                if cut.done:
                    break
        for hole in cut.rest():
            yield hole
