"""Batch and stream writers of the ``raftbroker`` data source: exactly-once into a topic.

Input columns: ``value`` (binary or string, required), ``key`` (binary or string), ``headers``
(map<string,string>), ``partition`` (int); other columns are ignored. The data source checks
their types, and refuses an overwrite, on the driver (``broker/spark/source.py``).

Exactly-once (SPEC §4, §7): every Spark task publishes as a producer session whose ``dedup_id`` is
``spark:<query id>:<batch id>:<Spark partition id>`` and whose message ids are the row indexes
(1, 2, ...). A task or micro-batch that Spark runs again (after a task failure, or after the query
was killed and restarted from its checkpoint) sends the same rows under the same ids, and the
cluster discards every id at or below the session's replicated watermark: nothing is stored
twice, however long the restart took. This needs the rows of a re-run task in the same order,
which holds for the ``raftbroker`` reader (deterministic ranges) and for per-row transformations.
Sessions are forgotten (``ResetWatermark``) once Spark can no longer re-run them: a batch write's
when it commits or aborts, a stream's sessions of batches before batch N when N commits (N
commits only after N-1 is in the checkpoint's commit log).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from broker.client import Client, OutgoingRecord
from broker.spark.options import WriterOptions

SESSION_PREFIX = "spark:"
BATCH_ID_PROPERTY = "streaming.sql.batchId"  # set by Spark on every task of a micro-batch
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass
class Written(WriterCommitMessage):
    """What one task stored: its session id, rows sent, and how many were new (not duplicates)."""

    dedup_id: str
    rows: int
    stored: int


def _bytes(value: Any, column: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"raftbroker writer: column {column!r} must be binary or string, got {type(value).__name__}")


def outgoing(row: Row) -> OutgoingRecord:
    """One input row as a record to publish."""
    fields = row.asDict()
    if "value" not in fields:
        raise ValueError("raftbroker writer: the DataFrame needs a 'value' column (binary or string)")
    value = _bytes(fields["value"], "value")
    if value is None:
        raise ValueError("raftbroker writer: 'value' is null")
    headers = fields.get("headers") or {}
    partition = fields.get("partition")
    return OutgoingRecord(value=value, key=_bytes(fields.get("key"), "key"),
                          partition=int(partition) if partition is not None else None,
                          headers={str(k): str(v) for k, v in headers.items()})


def publish_rows(options: WriterOptions, dedup_id: str, rows: Iterator[Row]) -> Written:
    """Publish ``rows`` in order as the producer session ``dedup_id`` (row i has msg_id i+1)."""
    sent = stored = 0
    with Client(options.bootstrap) as client:
        chunk: list[OutgoingRecord] = []

        def flush() -> None:
            nonlocal sent, stored, chunk
            results = client.publish_batch(options.topic, chunk, dedup_id=dedup_id, first_msg_id=sent + 1)
            stored += sum(1 for r in results if not r.duplicate)
            sent += len(chunk)
            chunk = []

        for row in rows:
            chunk.append(outgoing(row))
            if len(chunk) >= options.publish_batch_records:
                flush()
        if chunk:
            flush()
    return Written(dedup_id, sent, stored)


def forget_sessions(options: WriterOptions, prefix: str, before_batch: int | None = None) -> int:
    """Reset the watermarks of this writer's sessions (``prefix``), those of batches before
    ``before_batch`` only when it is given; returns how many were reset."""
    reset = 0
    with Client(options.bootstrap) as client:
        for mark in client.get_watermarks(options.topic):
            if not mark.dedup_id.startswith(prefix):
                continue
            if before_batch is not None:
                batch = mark.dedup_id[len(prefix):].split(":", 1)[0]
                if not batch.isdigit() or int(batch) >= before_batch:
                    continue
            client.reset_watermark(options.topic, mark.dedup_id)
            reset += 1
    return reset


class BatchWriter(DataSourceWriter):
    """``df.write.format("raftbroker")``: one session per task of this write (its id is chosen
    on the driver), so a retried task stores nothing twice."""

    def __init__(self, options: WriterOptions) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Row]) -> Written:
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        return publish_rows(self.options, f"{SESSION_PREFIX}{self.write_id}:0:{partition}", iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        forget_sessions(self.options, f"{SESSION_PREFIX}{self.write_id}:")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        forget_sessions(self.options, f"{SESSION_PREFIX}{self.write_id}:")


class StreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("raftbroker")``: sessions keyed by (query id, batch id, partition)."""

    def __init__(self, options: WriterOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Row]) -> Written:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("raftbroker stream writer: no Spark task context")
        query = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query or batch is None:
            raise RuntimeError("raftbroker stream writer: Spark did not tell the task its query and batch id")
        dedup_id = f"{SESSION_PREFIX}{query}:{batch}:{context.partitionId()}"
        return publish_rows(self.options, dedup_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for message in messages:
            if isinstance(message, Written):
                query = message.dedup_id[len(SESSION_PREFIX):].split(":", 1)[0]
                forget_sessions(self.options, f"{SESSION_PREFIX}{query}:", before_batch=batchId)
                return

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Keep the sessions: Spark runs the batch again under the same ids."""
