"""A streaming copy job for the exactly-once tests, run as its own process (so a test can kill it).

``python -m tests.spark.eo_job BOOTSTRAP SOURCE TARGET CHECKPOINT MASTER [FAIL_MARKER]``: copies
SOURCE to TARGET (same partition, the source offset in header ``src_offset``) with
``Trigger.AvailableNow`` in batches of at most 300 records, publishing 10 records per call. With
FAIL_MARKER, the task of source partition 1 raises once on its first attempt, after its first
records reached the target (the marker file records that, so the retry goes through).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import functions as F

from broker.client import Client
from broker.spark import session

FAIL_AFTER_ROWS = 60
TARGET_RECORDS_BEFORE_FAILING = 10


def fail_once(bootstrap: str, target: str, marker: str):  # type: ignore[no-untyped-def]
    """A mapInArrow function: rows pass through; partition 1's first attempt raises mid-batch."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        rows = 0
        for batch in batches:
            yield batch
            parts = set(batch.column("partition").to_pylist())
            rows += batch.num_rows
            if parts == {1} and rows >= FAIL_AFTER_ROWS and context.attemptNumber() == 0 \
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

    return run


def main(argv: list[str]) -> None:
    bootstrap, source, target, checkpoint, master = argv[:5]
    marker = argv[5] if len(argv) > 5 else None
    spark = session(master, app_name="eo-job", **{"spark.sql.execution.arrow.maxRecordsPerBatch": "20"})
    df = (spark.readStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", source)
          .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "300").load()
          .select("value", "partition", F.create_map(F.lit("src_offset"), F.col("offset").cast("string"))
                  .alias("headers")))
    if marker:
        df = df.mapInArrow(fail_once(bootstrap, target, marker), df.schema)
    query = (df.writeStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", target)
             .option("publishBatchRecords", "10").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
