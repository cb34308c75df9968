"""A streaming copy job for the exactly-once tests, run as its own process (so a test can kill it).

``python -m tests.spark.eo_job BOOTSTRAP SOURCE TARGET CHECKPOINT MASTER [FAIL_MARKER]``: copies
SOURCE to TARGET (same partition, the source offset in header ``src_offset``) with
``Trigger.AvailableNow`` in batches of at most 300 records, publishing 10 records per call. With
FAIL_MARKER (one batch of 900), a UDF slows the first attempt of source partition 1's task and a
thread SIGKILLs that task's Python worker once some of its rows are in the target: the task fails
mid-write and Spark retries it. The marker file records how many rows were stored at the kill,
and keeps the retry from failing again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from pyspark import TaskContext
from pyspark.sql import functions as F

from broker.client import Client
from broker.pipeline.runner import RESTARTS_MAX, transient
from broker.spark import session

TARGET_RECORDS_BEFORE_FAILING = 10


SLOW_ROW_S = 0.02  # partition 1's first attempt dawdles so it is still running when it is killed
_started: set[tuple[int, int]] = set()  # (stage, partition) whose killer thread runs, per worker


def _kill_when_stored(bootstrap: str, target: str, marker: str) -> None:
    """Wait until some of partition 1's rows are in the target, note how many, then SIGKILL this
    Python worker: its task fails in the middle of writing (Spark then retries it)."""
    seen = 0
    deadline = time.monotonic() + 300
    with Client(bootstrap) as client:
        while time.monotonic() < deadline:
            seen = client.end_offsets(target)[1][1]
            if seen >= TARGET_RECORDS_BEFORE_FAILING:
                break
            time.sleep(0.05)
    Path(marker).write_text(str(seen))
    os.kill(os.getpid(), signal.SIGKILL)


def fail_once(bootstrap: str, target: str, marker: str):  # type: ignore[no-untyped-def]
    """A UDF body: values pass through; on the first attempt of source partition 1's task a thread
    kills the task's Python worker once the first rows of the task are stored in the target."""

    def run(partition: int, value: bytes) -> bytes:
        context = TaskContext.get()
        if partition == 1 and context.attemptNumber() == 0 and not Path(marker).exists():
            key = (context.stageId(), context.partitionId())
            if key not in _started:
                _started.add(key)
                threading.Thread(target=_kill_when_stored, args=(bootstrap, target, marker), daemon=True).start()
            time.sleep(SLOW_ROW_S)
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
