"""Batch and stream readers of the ``raftbroker`` data source.

Planning (driver) resolves positions to offsets per topic partition and splits each partition's
range into :class:`OffsetRange` input partitions of at most ``maxRecordsPerPartition`` records.
Reading (executors) reads one range through :meth:`broker.client.Client.read_range_batches`, so the same
range always yields the same records (deterministic replays) and every hole is seen: with
``failOnDataLoss=true`` (the default) it fails the query with a message naming topic, partition
and the missing range; with ``false`` it logs the gap and goes on (SKIP_FORWARD, SPEC §3.3).
Planning refuses offsets out of range, naming topic, partition and offsets: a start after the
ending offset, and a start past a partition's end (unless ``failOnDataLoss=false``: it starts there).

Stream offsets are JSON objects ``{"<partition>": <next offset>}``, stored in Spark's checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from broker.client import Batch, Client, MissingRange
from broker.spark.options import EARLIEST, LATEST, ReaderOptions, SparkOptionError
from broker.spark.schema import arrow_schema, batches_to_arrow

log = logging.getLogger("broker.spark")
ARROW_BATCH_ROWS = 10_000  # rows per Arrow batch handed to Spark (at least; whole SDK batches)


class DataLossError(RuntimeError):
    """Records a query asked for are no longer in the log (``failOnDataLoss=true``)."""


class OffsetRange(InputPartition):
    """Offsets ``[start, end)`` of one topic partition: one Spark input partition."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


def data_loss(options: ReaderOptions, missing: MissingRange | str) -> None:
    """Fail (``failOnDataLoss=true``) or log the gap and go on."""
    if options.fail_on_data_loss:
        raise DataLossError(f"raftbroker: data loss: {missing}; set failOnDataLoss=false to skip forward")
    log.warning("raftbroker: skipping forward over lost records: %s", missing)


def resolve(client: Client, options: ReaderOptions, bounds: Mapping[int, tuple[int, int]]) -> dict[int, int]:
    """Starting offset per partition: the timestamp's, or the option's. A given offset past a
    partition's end (the next offset to be written) is out of range: refused, or with
    ``failOnDataLoss=false`` the partition starts at its end (logged), like Kafka's source."""
    starts: dict[int, int] = {}
    unknown = sorted(set(options.starting.per_partition) - set(bounds))
    if unknown:
        raise SparkOptionError(f"raftbroker: startingOffsets names partition(s) {unknown} that topic "
                               f"{options.topic!r} does not have (it has {len(bounds)})")
    for partition, (first, end) in sorted(bounds.items()):
        if options.starting_timestamp_ms is not None:
            starts[partition] = client.offset_for_timestamp(options.topic, partition, options.starting_timestamp_ms)
            continue
        wanted = options.starting.for_partition(partition)
        starts[partition] = first if wanted == EARLIEST else end if wanted == LATEST else wanted
        if starts[partition] > end:
            starts[partition] = past_end(options, partition, wanted, end)
    return starts


def past_end(options: ReaderOptions, partition: int, wanted: int, end: int) -> int:
    """Where a partition asked to start at ``wanted`` > its ``end`` starts (``failOnDataLoss=false``:
    at its end), or the refusal naming the partition and both offsets."""
    said = (f"startingOffsets asks for offset {wanted} of topic {options.topic!r} partition {partition}, "
            f"past its end {end} (the next offset to be written)")
    if options.fail_on_data_loss:
        raise SparkOptionError(f"raftbroker: {said}; set failOnDataLoss=false to start such a partition at its end")
    log.warning("raftbroker: %s: starting at %d", said, end)
    return end


def ending_offsets(options: ReaderOptions, bounds: Mapping[int, tuple[int, int]], starts: Mapping[int, int]
                   ) -> dict[int, int]:
    """Ending offset per partition (batch reads); an ending offset past a partition's end, or
    before its starting offset, is refused naming the partition and the offsets."""
    unknown = sorted(set(options.ending.per_partition) - set(bounds))
    if unknown:
        raise SparkOptionError(f"raftbroker: endingOffsets names partition(s) {unknown} that topic "
                               f"{options.topic!r} does not have (it has {len(bounds)})")
    ends = {}
    for partition, (_, end) in sorted(bounds.items()):
        wanted = options.ending.for_partition(partition)
        if wanted != LATEST and wanted > end:
            raise SparkOptionError(f"raftbroker: endingOffsets asks for offset {wanted} of partition {partition}, "
                                   f"beyond its end {end}")
        ends[partition] = end if wanted == LATEST else wanted
        if starts[partition] > ends[partition]:
            origin = "startingTimestamp" if options.starting_timestamp_ms is not None else "startingOffsets"
            raise SparkOptionError(f"raftbroker: topic {options.topic!r} partition {partition}: the starting offset "
                                   f"{starts[partition]} ({origin}) is after the ending offset {ends[partition]} "
                                   f"(endingOffsets)")
    return ends


def check_starts(options: ReaderOptions, starts: Mapping[int, int], bounds: Mapping[int, tuple[int, int]]
                 ) -> dict[int, int]:
    """Starts below a partition's retained start are data loss (raise, or move up to it)."""
    checked = dict(starts)
    for partition, start in starts.items():
        first = bounds[partition][0]
        if start < first:
            data_loss(options, MissingRange(options.topic, partition, start, first, "pruned or expired"))
            checked[partition] = first
    return checked


def split(starts: Mapping[int, int], ends: Mapping[int, int], max_records: int | None) -> list[OffsetRange]:
    """Ranges of at most ``max_records`` records covering ``[start, end)`` of each partition."""
    ranges: list[OffsetRange] = []
    for partition in sorted(starts):
        start, end = starts[partition], ends.get(partition, starts[partition])
        step = max_records or max(end - start, 1)
        ranges.extend(OffsetRange(partition, s, min(s + step, end)) for s in range(start, end, step))
    return ranges


def read_range(options: ReaderOptions, fields: Sequence[tuple[str, str]] | None, part: OffsetRange
               ) -> Iterator[pa.RecordBatch]:
    """The records of ``part`` as Arrow batches (runs on an executor)."""
    schema = arrow_schema(fields)
    with Client(options.bootstrap) as client:
        chunk: list[Batch] = []
        rows = 0
        for item in client.read_range_batches(options.topic, part.partition, part.start, part.end):
            if isinstance(item, MissingRange):
                data_loss(options, item)
                continue
            chunk.append(item)
            rows += len(item)
            if rows >= ARROW_BATCH_ROWS:
                yield batches_to_arrow(chunk, fields, schema)
                chunk, rows = [], 0
        if chunk:
            yield batches_to_arrow(chunk, fields, schema)


class BatchReader(DataSourceReader):
    """``spark.read.format("raftbroker")``: ranges are planned once, on the driver."""

    def __init__(self, options: ReaderOptions, fields: Sequence[tuple[str, str]] | None) -> None:
        self.options = options
        self.fields = fields

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        with Client(o.bootstrap) as client:
            bounds = client.end_offsets(o.topic)
            starts = resolve(client, o, bounds)
        ends = ending_offsets(o, bounds, starts)  # before check_starts: a prune is no option mistake
        starts = check_starts(o, starts, bounds)
        ranges = split(starts, ends, o.max_records_per_partition)
        return ranges or [OffsetRange(0, 0, 0)]  # Spark wants at least one partition

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, self.fields, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("raftbroker")``: per-partition offsets, admission control by
    ``maxRecordsPerTrigger``, ``Trigger.AvailableNow`` split into bounded batches."""

    def __init__(self, options: ReaderOptions, fields: Sequence[tuple[str, str]] | None) -> None:
        self.options = options
        self.fields = fields
        self._target: dict[int, int] | None = None  # the end offsets of an AvailableNow run

    def _bounds(self) -> dict[int, tuple[int, int]]:
        with Client(self.options.bootstrap) as client:
            return client.end_offsets(self.options.topic)

    def initialOffset(self) -> dict:
        with Client(self.options.bootstrap) as client:
            bounds = client.end_offsets(self.options.topic)
            return {str(p): o for p, o in resolve(client, self.options, bounds).items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {p: end for p, (_, end) in self._bounds().items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ends = {p: end for p, (_, end) in self._bounds().items()}
        if self._target is not None:
            ends = {p: min(e, self._target.get(p, e)) for p, e in ends.items()}
        current = {p: int(start.get(str(p), ends[p])) for p in ends}
        ends = {p: max(e, current[p]) for p, e in ends.items()}
        if isinstance(limit, ReadMaxRows):
            ends = admit(current, ends, limit.max_rows)
        return {str(p): o for p, o in sorted(ends.items())}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        starts = {int(p): int(o) for p, o in start.items()}
        ends = {int(p): int(o) for p, o in end.items()}
        for p in ends:
            starts.setdefault(p, ends[p])
        starts = check_starts(self.options, starts, self._bounds())
        return split(starts, ends, self.options.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(self.options, self.fields, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the checkpoint alone holds the reader's position."""


def admit(starts: Mapping[int, int], ends: Mapping[int, int], max_rows: int) -> dict[int, int]:
    """End offsets that admit at most ``max_rows`` records over all partitions, shared fairly
    (round-robin in steps), so every partition with data makes progress."""
    admitted = dict(starts)
    budget = max_rows
    while budget > 0:
        open_ = [p for p in sorted(ends) if admitted[p] < ends[p]]
        if not open_:
            break
        share = max(1, budget // len(open_))
        for p in open_:
            take = min(share, ends[p] - admitted[p], budget)
            admitted[p] += take
            budget -= take
            if budget == 0:
                break
    return admitted
