"""Collectors read at scrape time: the Raft state and statistics of this node, and its disk."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.replication import ReplicaStatus, Role
from broker.replication.stats import HistogramSnapshot, RaftStats


def _buckets(h: HistogramSnapshot) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip([*map(str, h.bounds_s), "+Inf"], h.counts, strict=True):
        total += count
        out.append((bound, total))
    return out


class RaftCollector(Collector):
    """Role, term, indexes, quorum and the store's size, from the replicator's status (never stale,
    no background thread). ``raftbroker_raft_has_quorum`` is 1 only on a leader that reaches a
    majority: the status's ``has_quorum`` is any role's view of its connections, and a follower
    connected to a majority would keep the NoQuorum alert's ``max by (job)`` at 1 with no leader."""

    def __init__(self, status: Callable[[], ReplicaStatus], store_size: Callable[[], int]) -> None:
        self._status = status
        self._store_size = store_size

    def collect(self) -> Iterator[Metric]:
        st = self._status()
        role = GaugeMetricFamily("raftbroker_raft_role", "1 for this node's current Raft role", labels=["role"])
        for r in Role:
            role.add_metric([r.value], 1.0 if st.role == r else 0.0)
        yield role
        yield GaugeMetricFamily("raftbroker_raft_term", "Current Raft term", value=st.term)
        yield GaugeMetricFamily("raftbroker_raft_commit_index", "Raft commit index", value=st.commit_index)
        yield GaugeMetricFamily("raftbroker_raft_applied_index", "Raft index applied to the store",
                                value=st.applied_index)
        yield GaugeMetricFamily("raftbroker_raft_has_quorum", "1 when this node is a leader with a quorum",
                                value=1.0 if st.role == Role.LEADER and st.has_quorum else 0.0)
        yield GaugeMetricFamily("raftbroker_raft_halted", "1 when Raft stopped for good on this node "
                                "(it serves nothing until repaired)", value=0.0 if st.halted_reason is None else 1.0)
        yield GaugeMetricFamily("raftbroker_store_size_bytes", "Approximate size of the local store",
                                value=self._store_size())


class RaftStatsCollector(Collector):
    """Elections, leader changes, follower lag (on the leader), journal fsync and snapshot latencies."""

    def __init__(self, stats: Callable[[], RaftStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        st = self._stats()
        yield CounterMetricFamily("raftbroker_raft_leader_changes", "New leaders this node learned of since "
                                  "it started (the first one included)", value=st.leader_changes)
        yield CounterMetricFamily("raftbroker_raft_elections_started", "Elections this node started (became "
                                  "candidate)", value=st.elections_started)
        yield CounterMetricFamily("raftbroker_raft_elections_won", "Elections this node won (became leader)",
                                  value=st.elections_won)
        entries = GaugeMetricFamily("raftbroker_raft_follower_lag_entries", "On the leader: log entries a "
                                    "follower does not hold yet", labels=["follower"])
        seconds = GaugeMetricFamily("raftbroker_raft_follower_lag_seconds", "On the leader: age of the oldest "
                                    "log entry a follower does not hold yet (0 when caught up)", labels=["follower"])
        for f in st.followers:
            entries.add_metric([f.raft_address], f.entries)
            seconds.add_metric([f.raft_address], f.seconds)
        yield entries
        yield seconds
        yield HistogramMetricFamily("raftbroker_raft_journal_fsync_seconds", "Duration of the Raft journal's "
                                    "fsyncs of appended entries", buckets=_buckets(st.fsync),
                                    sum_value=st.fsync.sum_s)
        snapshots = HistogramMetricFamily("raftbroker_raft_snapshot_seconds", "Duration of Raft snapshots: "
                                          "written (checkpoint taken and made durable), restored, or the "
                                          "replication thread's part of a write (taking the checkpoint)",
                                          labels=["kind"])
        snapshots.add_metric(["write"], _buckets(st.snapshot_write), st.snapshot_write.sum_s)
        snapshots.add_metric(["restore"], _buckets(st.snapshot_restore), st.snapshot_restore.sum_s)
        snapshots.add_metric(["take"], _buckets(st.snapshot_take), st.snapshot_take.sum_s)
        yield snapshots
        yield GaugeMetricFamily("raftbroker_raft_journal_cached_bytes", "Bytes of the newest Raft commands the "
                                "journal holds in memory (at most about raft_journal_cache_bytes)",
                                value=st.journal_cached_bytes)
        yield CounterMetricFamily("raftbroker_raft_journal_read_back_entries", "Raft entries read back from the "
                                  "journal's segments (older than its cache: a follower behind, an apply after "
                                  "a restart)", value=st.journal_read_backs)


class DiskCollector(Collector):
    """Size and free space of the file system holding the node's data directory."""

    def __init__(self, data_dir: Path) -> None:
        self._data_dir = data_dir

    def collect(self) -> Iterator[Metric]:
        usage = shutil.disk_usage(self._data_dir)
        yield GaugeMetricFamily("raftbroker_data_dir_filesystem_size_bytes", "Size of the file system holding "
                                "the data directory", value=usage.total)
        yield GaugeMetricFamily("raftbroker_data_dir_filesystem_free_bytes", "Bytes available to the node on "
                                "the file system holding the data directory", value=usage.free)
