"""Running a :class:`~broker.pipeline.dag.Pipeline` on Spark: one Structured Streaming query per
stage, reading with the ``raftbroker`` source from the stage's checkpoint (earliest the first
time) and writing exactly-once with the ``raftbroker`` sink.

``until="caught_up"``: stages run in dependency order, each with ``Trigger.AvailableNow`` (in
bounded micro-batches when ``max_records_per_batch`` is given), so when ``run`` returns every
record present at its start has gone through the whole DAG. A stage that fails for a transient
Spark reason (:func:`transient`) is restarted from its checkpoint, at most ``RESTARTS_MAX`` times.
``until="forever"``: every stage runs at once, polling for new records every
``trigger_interval_s``, until one fails (raised) or the caller interrupts.
``dry_run=True`` maps what each source holds now, prints what would be written, and writes
nothing (no checkpoint either; a stage reading another's target sees that topic as it is, since
the upstream stage wrote nothing).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from broker.client import Client, OutgoingRecord, Record
from broker.pipeline.dag import Pipeline, Stage

UNTIL = ("caught_up", "forever")
RESTARTS_MAX = 3  # restarts of a caught-up stage after a transient Spark failure
TRANSIENT_FAILURES = ("Python worker failed to connect back",)  # the JVM waits only 10 s for a worker


def transient(err: BaseException) -> bool:
    """A failure of Spark's machinery (not of the stage) that a restart from the checkpoint cures:
    on a loaded machine a Python worker may start slower than the JVM's fixed 10 s wait."""
    return any(marker in str(err) for marker in TRANSIENT_FAILURES)
DEFAULT_CHECKPOINT_ROOT = Path(".raftbroker-pipelines")
POLL_S = 0.5
OUTPUT_TYPE = "array<struct<value: binary, key: binary, headers: map<string,string>, partition: int>>"
RECORD_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp", "op", "origin")


@dataclass(frozen=True)
class Progress:
    """One micro-batch of one stage: records read, records written, and the stage's lag (records
    of its source not yet read when the batch ended)."""

    stage: str
    batch_id: int
    records_in: int
    records_out: int
    lag: int

    def line(self) -> str:
        return (f"{self.stage} batch {self.batch_id}: {self.records_in} in, {self.records_out} out, "
                f"lag {self.lag}")


@dataclass
class StageReport:
    """What one stage did in a run (or, in a dry run, would do)."""

    records_in: int = 0
    records_out: int = 0
    batches: int = 0
    preview: list[dict[str, Any]] = field(default_factory=list)


def _record(row: Mapping[str, Any]) -> Record:
    ms = int(row["timestamp"].timestamp() * 1000)  # naive datetimes are local time, as Spark gives them
    key = row["key"]
    return Record(topic=row["topic"], partition=row["partition"], offset=row["offset"],
                  key=bytes(key) if key is not None else None, value=bytes(row["value"]),
                  headers=dict(row["headers"] or {}), timestamp_ms=ms, position=b"",
                  op=row["op"], origin=row["origin"])


def _outputs(result: Any) -> list[Any]:
    if result is None:
        return []
    if isinstance(result, list | tuple):
        return list(result)
    if isinstance(result, Iterator):
        return list(result)
    return [result]


def _output(item: Any, source: Record, target_partitions: int) -> dict[str, Any]:
    if isinstance(item, OutgoingRecord):
        value: Any = item.value
        key, partition, headers = item.key, item.partition, dict(item.headers)
    else:
        key, partition, headers = None, None, {}
        if isinstance(item, BaseModel):
            value = item.model_dump_json()
        elif isinstance(item, dict):
            value = json.dumps(item)
        elif isinstance(item, bytes | str):
            value = item
        else:
            raise TypeError(f"a pipeline function returned {type(item).__name__}; return a Pydantic model, "
                            f"dict, bytes, str or OutgoingRecord (or a list of them, or None)")
    if key is None and partition is None:
        key = source.key
        partition = None if key is not None else source.partition % target_partitions
    return {"value": value.encode() if isinstance(value, str) else value,
            "key": key.encode() if isinstance(key, str) else key,
            "headers": headers, "partition": partition}


def mapper(stage: Stage, target_partitions: int) -> Callable[..., list[tuple[Any, ...]]]:
    """The per-record function of ``stage`` as a Spark UDF body (runs on executors): the
    source record's columns in, the list of output records (value, key, headers, partition) out."""
    fn, model = stage.fn, stage.source.model

    def run(*columns: Any) -> list[tuple[Any, ...]]:
        record = _record(dict(zip(RECORD_COLUMNS, columns, strict=True)))
        argument = model.model_validate_json(record.value) if model is not None else record
        outputs = [_output(item, record, target_partitions) for item in _outputs(fn(argument))]
        return [(o["value"], o["key"], dict(o["headers"]), o["partition"]) for o in outputs]

    return run


def mapped(df: Any, stage: Stage, target_partitions: int) -> Any:
    """``df`` (the raftbroker source's columns) mapped through ``stage``: one row per output, in
    source order (a Python UDF returning the outputs, exploded; no pandas needed). ``useArrow=False``
    says so: PySpark 4 turns Arrow-optimized UDFs on by default, and without pandas it falls back to
    this same UDF with a warning that PyArrow or pandas is missing."""
    from pyspark.sql import functions as F

    udf = F.udf(mapper(stage, target_partitions), OUTPUT_TYPE, useArrow=False)
    outputs = udf(*[F.col(c) for c in RECORD_COLUMNS])
    return df.select(F.explode(outputs).alias("o")).select("o.*")


def _partitions(bootstrap: str, pipeline: Pipeline) -> dict[str, int]:
    """Partition count of every topic; an unknown one fails now, naming it."""
    counts = {}
    with Client(bootstrap) as client:
        for ref in pipeline.topics():
            counts[ref.name] = client.describe_topic(ref.name).partition_count
    return counts


def _lag(bootstrap: str, topic: str, end_offset: Any) -> int:
    ends = json.loads(end_offset) if isinstance(end_offset, str) else dict(end_offset or {})
    with Client(bootstrap) as client:
        return sum(max(0, end - int(ends.get(str(p), start))) for p, (start, end) in client.end_offsets(topic).items())


def run(pipeline: Pipeline, *, bootstrap: str, until: str = "caught_up", master: str | None = None,
        checkpoint: str | Path | None = None, dry_run: bool = False, spark: Any = None,
        on_progress: Callable[[Progress], None] | None = None, max_records_per_batch: int | None = None,
        trigger_interval_s: float = 1.0, dry_run_preview: int = 10) -> dict[str, StageReport]:
    """Run ``pipeline`` against the cluster at ``bootstrap``; returns a report per stage name.

    ``master``: a Spark master URL (default ``local[*]``), or pass a session as ``spark``.
    ``checkpoint``: the root of the stages' checkpoint directories (default
    ``.raftbroker-pipelines/<pipeline name>``); a rerun resumes where the last one stopped.
    ``on_progress``: called with a :class:`Progress` after every micro-batch (on this thread).
    """
    if until not in UNTIL:
        raise ValueError(f"until must be one of {', '.join(UNTIL)}, got {until!r}")
    if trigger_interval_s <= 0 or dry_run_preview < 0:
        raise ValueError("trigger_interval_s must be > 0 and dry_run_preview >= 0")
    counts = _partitions(bootstrap, pipeline)
    if spark is None:
        from broker.spark import session

        spark = session(master or "local[*]", app_name=f"raftbroker-pipeline-{pipeline.name}")
    if dry_run:
        return {s.name: _dry_run(spark, bootstrap, s, counts[s.target.name], dry_run_preview)
                for s in pipeline.order()}
    root = Path(checkpoint) if checkpoint is not None else DEFAULT_CHECKPOINT_ROOT / pipeline.name
    reports = {s.name: StageReport() for s in pipeline.stages}
    report = _reporter(bootstrap, reports, on_progress)
    if until == "caught_up":
        for stage in pipeline.order():
            for attempt in range(1, RESTARTS_MAX + 2):
                query = _start(spark, bootstrap, stage, counts[stage.target.name], root, max_records_per_batch,
                               None)
                try:
                    _watch([query], [stage], report)
                    break
                except RuntimeError as err:  # restart from the checkpoint: the writes are exactly-once
                    if attempt > RESTARTS_MAX or not transient(err):
                        raise
    else:
        queries = [_start(spark, bootstrap, s, counts[s.target.name], root, max_records_per_batch,
                          trigger_interval_s) for s in pipeline.stages]
        try:
            _watch(queries, pipeline.stages, report)
        finally:
            for query in queries:
                query.stop()
    return reports


def _start(spark: Any, bootstrap: str, stage: Stage, target_partitions: int, root: Path,
           max_records: int | None, interval_s: float | None) -> Any:
    source = (spark.readStream.format("raftbroker").option("bootstrap", bootstrap)
              .option("topic", stage.source.name).option("startingOffsets", "earliest"))
    if max_records:
        source = source.option("maxRecordsPerTrigger", str(max_records))
    writer = (mapped(source.load(), stage, target_partitions).writeStream
              .format("raftbroker").option("bootstrap", bootstrap).option("topic", stage.target.name)
              .option("checkpointLocation", str(root / stage.name)).queryName(stage.name))
    writer = writer.trigger(availableNow=True) if interval_s is None else writer.trigger(
        processingTime=f"{interval_s} seconds")
    return writer.start()


def _reporter(bootstrap: str, reports: dict[str, StageReport], on_progress: Callable[[Progress], None] | None
              ) -> Callable[[Stage, Mapping[str, Any]], None]:
    def report(stage: Stage, progress: Mapping[str, Any]) -> None:
        sink = progress.get("sink") or {}
        out = max(0, int(sink.get("numOutputRows", 0) or 0))
        sources = progress.get("sources") or [{}]
        item = Progress(stage.name, int(progress["batchId"]), int(progress.get("numInputRows", 0)), out,
                        _lag(bootstrap, stage.source.name, sources[0].get("endOffset")))
        r = reports[stage.name]
        r.records_in += item.records_in
        r.records_out += item.records_out
        r.batches += 1
        if on_progress is not None:
            on_progress(item)

    return report


def _watch(queries: list[Any], stages: list[Stage], report: Callable[[Stage, Mapping[str, Any]], None]) -> None:
    """Report each new micro-batch until every query ended (or one failed: raised)."""
    seen: list[set[int]] = [set() for _ in queries]

    def sweep() -> None:
        for query, stage, done in zip(queries, stages, seen, strict=True):
            for progress in query.recentProgress:
                p = progress if isinstance(progress, Mapping) else json.loads(progress.json)
                if p["batchId"] not in done and (p.get("numInputRows") or p.get("sink")):
                    done.add(p["batchId"])
                    report(stage, p)

    while any(q.isActive for q in queries):
        for query in queries:
            if query.exception() is not None:
                raise RuntimeError(f"pipeline stage {query.name} failed: {query.exception()}")
        sweep()
        time.sleep(POLL_S)
    sweep()
    for query in queries:
        if query.exception() is not None:
            raise RuntimeError(f"pipeline stage {query.name} failed: {query.exception()}")


def _dry_run(spark: Any, bootstrap: str, stage: Stage, target_partitions: int, preview: int) -> StageReport:
    source = (spark.read.format("raftbroker").option("bootstrap", bootstrap)
              .option("topic", stage.source.name).load())
    outputs = mapped(source, stage, target_partitions)
    report = StageReport(records_in=source.count(), records_out=outputs.count())
    for row in outputs.limit(preview).collect():
        report.preview.append({"partition": row.partition, "key": row.key, "value": bytes(row.value),
                               "headers": dict(row.headers or {})})
    print(f"[dry run] {stage.name}: {report.records_in} records in, {report.records_out} would be written "
          f"to {stage.target.name}")
    for item in report.preview:
        print(f"[dry run]   -> {stage.target.name} partition={item['partition']} key={item['key']!r} "
              f"value={item['value'][:80]!r}")
    return report
