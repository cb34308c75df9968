"""A streaming copy job for the exactly-once tests, run as its own process (so a test can kill it).

``python -m tests.spark.eo_job BOOTSTRAP SOURCE TARGET CHECKPOINT MASTER [FAIL_MARKER]``: copies
SOURCE to TARGET (same partition, the source offset in header ``src_offset``) with
``Trigger.AvailableNow`` in batches of at most 300 records, publishing 10 records per call. With
FAIL_MARKER (one batch of 900), a UDF makes the task of source partition 1 raise once, on its
first attempt at its 250th row, after its first records reached the target (Python UDFs hand
rows on in batches of 100, so the first 200 flow to the writer first); the marker file records
how many were stored, and keeps the retry from failing again.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pyspark import TaskContext
from pyspark.sql import functions as F

from broker.client import Client
from broker.pipeline.runner import RESTARTS_MAX, transient
from broker.spark import session

FAIL_AFTER_ROWS = 250
TARGET_RECORDS_BEFORE_FAILING = 10


_rows: dict[tuple[int, int, int], int] = {}  # (stage, partition, attempt) -> rows seen, per worker


def fail_once(bootstrap: str, target: str, marker: str):  # type: ignore[no-untyped-def]
    """A UDF body: values pass through; the task of source partition 1 raises on its first
    attempt once it has seen FAIL_AFTER_ROWS rows and its first rows are stored in the target."""

    def run(partition: int, value: bytes) -> bytes:
        context = TaskContext.get()
        key = (context.stageId(), context.partitionId(), context.attemptNumber())
        _rows[key] = _rows.get(key, 0) + 1
        if partition == 1 and _rows[key] == FAIL_AFTER_ROWS and context.attemptNumber() == 0 \
                and not Path(marker).exists():
            seen = 0
            deadline = time.monotonic() + 120
            with Client(bootstrap) as client:
                while time.monotonic() < deadline:
                    seen = client.end_offsets(target)[1][1]
                    if seen >= TARGET_RECORDS_BEFORE_FAILING:
                        break
                    time.sleep(0.2)
            Path(marker).write_text(str(seen))
            raise RuntimeError(f"injected task failure after {seen} records of partition 1 were stored")
        return value

    return run


def main(argv: list[str]) -> None:
    bootstrap, source, target, checkpoint, master = argv[:5]
    marker = argv[5] if len(argv) > 5 else None
    spark = session(master, app_name="eo-job")
    df = (spark.readStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", source)
          .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "900" if marker else "300").load()
          .select("value", "partition", F.create_map(F.lit("src_offset"), F.col("offset").cast("string"))
                  .alias("headers")))
    if marker:
        fail = F.udf(fail_once(bootstrap, target, marker), "binary")
        df = df.select(fail(F.col("partition"), F.col("value")).alias("value"), "partition", "headers")
    for attempt in range(1, RESTARTS_MAX + 2):  # a slow Python worker start: restart from the checkpoint
        query = (df.writeStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", target)
                 .option("publishBatchRecords", "10").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
            break
        except Exception as err:
            if attempt > RESTARTS_MAX or not transient(err):
                raise
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
