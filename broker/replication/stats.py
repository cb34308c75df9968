"""Read-only figures of the Raft layer for operators (metrics): elections, leader changes, follower
lag, journal fsync and snapshot latencies.

The replication thread (and the snapshot packing thread) write; any thread reads
:meth:`RaftCounters.snapshot`, which returns an immutable :class:`RaftStats`. No prometheus import
here: ``broker.services.metrics`` turns these into metric families.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

# upper bounds, seconds (an implicit +Inf bucket follows)
FSYNC_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SNAPSHOT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# leader side: (log index, time first seen) samples kept to date the entries a follower lacks
APPEND_SAMPLES_MAX = 4096
LAG_PERIOD_S = 0.25  # how often a leader recomputes its followers' lag


@dataclass(frozen=True)
class HistogramSnapshot:
    """Counts per bucket (not cumulative; the last one is +Inf), their sum in seconds, and the bounds."""

    bounds_s: tuple[float, ...]
    counts: tuple[int, ...]
    sum_s: float

    @property
    def count(self) -> int:
        return sum(self.counts)


class LatencyTally:
    """A thread-safe histogram of durations in seconds with fixed bucket bounds."""

    def __init__(self, bounds_s: tuple[float, ...]) -> None:
        assert list(bounds_s) == sorted(bounds_s) and len(set(bounds_s)) == len(bounds_s), "bounds must increase"
        self._bounds_s = bounds_s
        self._counts = [0] * (len(bounds_s) + 1)
        self._sum_s = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self._bounds_s, seconds)] += 1
            self._sum_s += seconds

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            return HistogramSnapshot(self._bounds_s, tuple(self._counts), self._sum_s)


@dataclass(frozen=True)
class FollowerLag:
    """As the leader sees one follower: entries of the leader's log it does not hold yet, and the age
    in seconds of the oldest of them (0 when caught up)."""

    raft_address: str
    entries: int
    seconds: float


@dataclass(frozen=True)
class RaftStats:
    """A point-in-time copy of :class:`RaftCounters`; ``followers`` is empty unless this node leads."""

    leader_changes: int
    elections_started: int
    elections_won: int
    followers: tuple[FollowerLag, ...]
    fsync: HistogramSnapshot
    snapshot_write: HistogramSnapshot
    snapshot_restore: HistogramSnapshot
    snapshot_take: HistogramSnapshot  # the replication thread held by taking a snapshot
    journal_cached_bytes: int = 0  # commands the journal holds in memory
    journal_read_backs: int = 0  # entries it has read back from its segments since it opened


class AppendClock:
    """Leader side: when each log index was first seen, to say how old a follower's lag is.

    :meth:`note` records (index, now) when the last index grew; :meth:`age_s` of a match index is the
    time since the first sample above it (the oldest entry the follower lacks, to tick precision).
    At most :data:`APPEND_SAMPLES_MAX` samples are kept (beyond that the age is underestimated)."""

    def __init__(self) -> None:
        self._indexes: list[int] = []
        self._times: list[float] = []

    def reset(self) -> None:
        self._indexes.clear()
        self._times.clear()

    def note(self, last_index: int, now_s: float) -> None:
        if self._indexes and last_index <= self._indexes[-1]:
            if last_index < self._indexes[-1]:  # the log was cut back (new term): start again
                self.reset()
            else:
                return
        self._indexes.append(last_index)
        self._times.append(now_s)
        if len(self._indexes) > APPEND_SAMPLES_MAX:
            del self._indexes[:APPEND_SAMPLES_MAX // 2]
            del self._times[:APPEND_SAMPLES_MAX // 2]

    def forget_through(self, index: int) -> None:
        """Drop samples every follower has passed (keep the last one: it dates new appends)."""
        cut = min(bisect.bisect_right(self._indexes, index), len(self._indexes) - 1)
        if cut > 0:
            del self._indexes[:cut]
            del self._times[:cut]

    def age_s(self, match_index: int, now_s: float) -> float:
        pos = bisect.bisect_right(self._indexes, match_index)
        if pos >= len(self._indexes):
            return 0.0
        return max(0.0, now_s - self._times[pos])


class RaftCounters:
    """Mutable figures: counters bumped by the replication thread, tallies by whoever times the work."""

    def __init__(self) -> None:
        self.leader_changes = 0
        self.elections_started = 0
        self.elections_won = 0
        self.followers: tuple[FollowerLag, ...] = ()  # replaced whole by the replication thread
        self.fsync = LatencyTally(FSYNC_BUCKETS_S)
        self.snapshot_write = LatencyTally(SNAPSHOT_BUCKETS_S)
        self.snapshot_restore = LatencyTally(SNAPSHOT_BUCKETS_S)
        self.snapshot_take = LatencyTally(SNAPSHOT_BUCKETS_S)
        self.journal_cached_bytes = 0  # copied from the journal at every tick
        self.journal_read_backs = 0

    def snapshot(self) -> RaftStats:
        return RaftStats(self.leader_changes, self.elections_started, self.elections_won, self.followers,
                         self.fsync.snapshot(), self.snapshot_write.snapshot(), self.snapshot_restore.snapshot(),
                         self.snapshot_take.snapshot(), self.journal_cached_bytes, self.journal_read_backs)


class LeadershipTracker:
    """Fed by the replication thread at every tick: counts and logs leader changes (every new leader
    this node learns of, the first one included) and, while this node leads, refreshes ``counters.followers``
    every :data:`LAG_PERIOD_S` from the followers' match indexes."""

    def __init__(self, counters: RaftCounters) -> None:
        self._counters = counters
        self._clock = AppendClock()
        self._leader_seen: str | None = None
        self._lag_updated_s = -math.inf

    def observe(self, leader: str | None, leading: bool, last_index: int, matches: Mapping[str, int],
                now_s: float) -> None:
        """``last_index``: this node's last log index; ``matches``: follower address -> match index
        (read only when ``leading``); ``now_s``: a monotonic clock."""
        if leader is not None and leader != self._leader_seen:
            was = self._leader_seen
            self._leader_seen = leader
            self._counters.leader_changes += 1
            # every change an operator may need to line up with a pause (the first one too)
            log.info("leader: %s%s (before: %s)", leader, ", this node" if leading else "", was or "none seen")
        if not leading:
            if self._counters.followers:
                self._counters.followers = ()
            self._clock.reset()
            self._lag_updated_s = -math.inf
            return
        self._clock.note(last_index, now_s)
        if now_s - self._lag_updated_s < LAG_PERIOD_S:
            return
        self._lag_updated_s = now_s
        self._counters.followers = tuple(
            FollowerLag(address, max(0, last_index - match), self._clock.age_s(match, now_s))
            for address, match in sorted(matches.items()))
        if matches:
            self._clock.forget_through(min(matches.values()))
