"""The archive job (SPEC §7, §2.2): a topic to Parquet partitioned by date, then a prune of what
was durably written.

One run: (1) the group (default ``archive``) is created if needed and marked ``lead``; (2) each
partition is read from max(the group's committed offset, the highest offset already in the
archive + 1) to its end offset now, one Spark task per partition; (3) the rows are appended to
``DIR/date=YYYY-MM-DD/*.parquet`` (columns of the ``raftbroker`` source) and every new file and
directory is fsynced; (4) the group's position moves to the end offsets (``seek``); (5) the topic
is pruned by the group, per partition no further than any ``protect`` group's position.

Crash safety: the archive itself says what was written (step 2 reads its highest offset per
partition), so a run that crashed after writing and before committing writes nothing twice when
run again; a run that crashed before Spark's job commit left only ``_temporary`` files, which
readers ignore. Nothing is pruned that is not both in fsynced Parquet and committed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from broker.client import Client, GroupNotFound

DEFAULT_GROUP = "archive"


@dataclass
class ArchiveResult:
    """What one run did: rows written per partition range, records pruned, and the protect
    groups that held the prune back (their position was below what was archived)."""

    topic: str
    directory: str
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    records_written: int = 0
    pruned: int = 0
    blocked_by: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        held = f"; prune held back by protect group(s) {', '.join(self.blocked_by)}" if self.blocked_by else ""
        return (f"archived {self.records_written} record(s) of {self.topic} to {self.directory}; "
                f"pruned {self.pruned}{held}")


def archived_ends(spark: Any, directory: Path, topic: str) -> dict[int, int]:
    """Per partition, one past the highest offset of ``topic`` already in the archive."""
    if not any(directory.glob("date=*/*.parquet")):
        return {}
    from pyspark.sql import functions as F

    rows = (spark.read.parquet(str(directory)).filter(F.col("topic") == topic)
            .groupBy("partition").agg(F.max("offset").alias("last")).collect())
    return {int(r.partition): int(r.last) + 1 for r in rows}


def fsync_tree(directory: Path, since_s: float) -> int:
    """fsync every file under ``directory`` modified since ``since_s``, then the directories."""
    synced = 0
    for root, _, files in os.walk(directory):
        for name in files:
            path = Path(root) / name
            if path.stat().st_mtime >= since_s - 1:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                synced += 1
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return synced


def _lead_positions(client: Client, topic: str, group: str) -> dict[int, int]:
    try:
        info = client.groups.describe(topic, group)
    except GroupNotFound:
        info = client.groups.create(topic, group, mode="stream", start="earliest")
    if info.prune_role != "lead":
        client.groups.mark(topic, group, "lead")
    return {p.partition: p.committed for p in client.groups.lag(topic, group).partitions}


def _protect_positions(client: Client, topic: str) -> dict[str, dict[int, int]]:
    return {g.group: {p.partition: p.committed for p in client.groups.lag(topic, g.group).partitions}
            for g in client.groups.list(topic) if g.prune_role == "protect"}


def run_archive(spark: Any, bootstrap: str, topic: str, directory: Path | str, *, group: str = DEFAULT_GROUP,
                prune: bool = True) -> ArchiveResult:
    """One archive run (see the module contract); raises on data loss or an unknown topic."""
    from pyspark.sql import functions as F

    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    result = ArchiveResult(topic, str(directory))
    with Client(bootstrap) as client:
        bounds = client.end_offsets(topic)
        committed = _lead_positions(client, topic, group)
        archived = archived_ends(spark, directory, topic)
        starts = {p: max(committed.get(p, 0), archived.get(p, 0)) for p in bounds}
        ends = {p: max(end, starts[p]) for p, (_, end) in bounds.items()}
        result.ranges = {p: (starts[p], ends[p]) for p in bounds if ends[p] > starts[p]}
        if result.ranges:
            started_s = time.time()
            df = (spark.read.format("raftbroker").option("bootstrap", bootstrap).option("topic", topic)
                  .option("startingOffsets", json.dumps({str(p): o for p, o in starts.items()}))
                  .option("endingOffsets", json.dumps({str(p): o for p, o in ends.items()})).load())
            df.withColumn("date", F.to_date("timestamp")).write.mode("append").partitionBy("date").parquet(
                str(directory))
            fsync_tree(directory, started_s)
            result.records_written = sum(e - s for s, e in result.ranges.values())
        for p, end in ends.items():
            if end > committed.get(p, 0):
                client.groups.seek(topic, group, end, partition=p)
        if prune:
            result.pruned, result.blocked_by = _prune(client, topic, group, ends, bounds)
    return result


def _prune(client: Client, topic: str, group: str, ends: dict[int, int], bounds: dict[int, tuple[int, int]]
           ) -> tuple[int, list[str]]:
    protect = _protect_positions(client, topic)
    pruned = 0
    blocked: set[str] = set()
    for p, end in ends.items():
        limit = end
        for name, positions in protect.items():
            if positions.get(p, 0) < limit:
                limit = positions.get(p, 0)
                blocked.add(name)
        if limit > bounds[p][0]:
            pruned += client.prune(topic, limit, partition=p, group=group)
    return pruned, sorted(blocked)
