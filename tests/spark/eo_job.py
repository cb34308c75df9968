"""A streaming copy job for the exactly-once tests, run as its own process (so a test can kill it).

``python -m tests.spark.eo_job BOOTSTRAP SOURCE TARGET CHECKPOINT MASTER [FAIL_MARKER]``: copies
SOURCE to TARGET (same partition, the source offset in header ``src_offset``) with
``Trigger.AvailableNow`` in batches of at most 300 records, publishing 10 records per call. With
FAIL_MARKER (one batch of 900), the writer's Python worker SIGKILLs itself in the middle of the
first attempt of source partition 1's task, with 140 of the task's rows stored: the task fails
mid-write and Spark retries it. The marker file records how many rows were stored at the kill,
and keeps the retry from failing again. (A UDF cannot stand in for the crash: a pickled UDF's
results reach the writer only when its worker flushes, at the end of the task.)
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.types import StructType

from broker.client import Client
from broker.pipeline.runner import RESTARTS_MAX, transient
from broker.spark import RaftBrokerDataSource, session
from broker.spark.options import WriterOptions
from broker.spark.writer import StreamWriter, Written

CRASH_FORMAT = "raftbroker-crash-once"
CRASH_AT_ROW = 150  # the writer publishes 10 rows per call: 140 of the task's rows are stored then


class CrashOnceStreamWriter(StreamWriter):
    """The real stream writer, whose Python worker SIGKILLs itself on the first attempt of source
    partition 1's task when the writer asks for row CRASH_AT_ROW: the task dies in the middle of
    writing, with part of its rows stored, and Spark retries it (a crashed executor process)."""

    def __init__(self, options: WriterOptions, marker: str) -> None:
        super().__init__(options)
        self.marker = marker

    def write(self, iterator: Iterator[Row]) -> Written:
        return super().write(self._crash_once(iterator))

    def _crash_once(self, rows: Iterator[Row]) -> Iterator[Row]:
        context = TaskContext.get()
        for index, row in enumerate(rows, 1):
            if (index == CRASH_AT_ROW and row["partition"] == 1 and context is not None
                    and context.attemptNumber() == 0 and not Path(self.marker).exists()):
                with Client(self.options.bootstrap) as client:
                    Path(self.marker).write_text(str(client.end_offsets(self.options.topic)[1][1]))
                os.kill(os.getpid(), signal.SIGKILL)
            yield row


class CrashOnceDataSource(RaftBrokerDataSource):
    """``raftbroker`` with :class:`CrashOnceStreamWriter` (option ``crashMarker``: the marker file)."""

    @classmethod
    def name(cls) -> str:
        return CRASH_FORMAT

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # crashMarker is this test's own option: the raftbroker writer refuses options it does not know
        options = {k: v for k, v in self.options.items() if k.lower() != "crashmarker"}
        writer = RaftBrokerDataSource(options).streamWriter(schema, overwrite)
        assert isinstance(writer, StreamWriter)
        return CrashOnceStreamWriter(writer.options, self.options["crashMarker"])


def main(argv: list[str]) -> None:
    bootstrap, source, target, checkpoint, master = argv[:5]
    marker = argv[5] if len(argv) > 5 else None
    spark = session(master, app_name="eo-job")
    df = (spark.readStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", source)
          .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", "900" if marker else "300").load()
          .select("value", "partition", F.create_map(F.lit("src_offset"), F.col("offset").cast("string"))
                  .alias("headers")))
    spark.dataSource.register(CrashOnceDataSource)
    for attempt in range(1, RESTARTS_MAX + 2):  # a slow Python worker start: restart from the checkpoint
        writer = (df.writeStream.format(CRASH_FORMAT if marker else "raftbroker")
                  .option("bootstrap", bootstrap).option("topic", target)
                  .option("publishBatchRecords", "10").option("checkpointLocation", checkpoint))
        if marker:  # only CRASH_FORMAT knows the option (raftbroker refuses an option it does not know)
            writer = writer.option("crashMarker", marker)
        query = writer.trigger(availableNow=True).start()
        try:
            query.awaitTermination()
            break
        except Exception as err:
            if attempt > RESTARTS_MAX or not transient(err):
                raise
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
