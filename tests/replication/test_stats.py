"""The Raft figures behind the metrics: latency tallies, leader changes, follower lag."""

from __future__ import annotations

import logging

import pytest

from broker.replication.stats import LAG_PERIOD_S, AppendClock, LatencyTally, LeadershipTracker, RaftCounters

pytestmark = pytest.mark.unit


def test_latency_tally_puts_each_duration_in_its_bucket_and_sums_them() -> None:
    tally = LatencyTally((0.01, 0.1))
    for seconds in (0.005, 0.01, 0.05, 3.0):
        tally.observe(seconds)
    h = tally.snapshot()
    assert h.counts == (2, 1, 1)  # a bound is inclusive (le), the last bucket is +Inf
    assert h.count == 4 and h.sum_s == pytest.approx(3.065)


def test_append_clock_dates_the_oldest_entry_a_follower_lacks() -> None:
    clock = AppendClock()
    clock.note(10, now_s=100.0)
    clock.note(15, now_s=101.0)
    clock.note(15, now_s=102.0)  # no new entry: no sample
    clock.note(20, now_s=103.0)
    assert clock.age_s(20, now_s=110.0) == 0.0  # caught up
    assert clock.age_s(15, now_s=110.0) == 7.0  # lacks 16..20, first seen at 103
    assert clock.age_s(12, now_s=110.0) == 9.0  # lacks 13..15, seen by 101
    clock.forget_through(15)
    assert clock.age_s(15, now_s=110.0) == 7.0
    clock.note(5, now_s=111.0)  # log cut back under a new leader: start again
    assert clock.age_s(4, now_s=112.0) == 1.0


def test_leadership_tracker_counts_new_leaders_and_reports_lag_only_while_leading(
        caplog: pytest.LogCaptureFixture) -> None:
    counters = RaftCounters()
    tracker = LeadershipTracker(counters)
    with caplog.at_level(logging.INFO, logger="broker.replication.stats"):
        tracker.observe(None, False, 1, {}, now_s=0.0)
        tracker.observe("a:1", False, 1, {}, now_s=1.0)
        tracker.observe("a:1", False, 2, {}, now_s=2.0)
        tracker.observe("b:1", True, 5, {"a:1": 2, "c:1": 5}, now_s=3.0)
    assert [r.getMessage() for r in caplog.records] == ["leader: a:1 (before: none seen)",
                                                         "leader: b:1, this node (before: a:1)"]
    st = counters.snapshot()
    assert st.leader_changes == 2
    lag = {f.raft_address: (f.entries, f.seconds) for f in st.followers}
    assert lag == {"a:1": (3, 0.0), "c:1": (0, 0.0)}  # entries 3..5 first seen now
    tracker.observe("b:1", True, 5, {"a:1": 2, "c:1": 5}, now_s=3.0 + LAG_PERIOD_S + 4.0)
    lag = {f.raft_address: (f.entries, f.seconds) for f in counters.snapshot().followers}
    assert lag == {"a:1": (3, pytest.approx(4.0 + LAG_PERIOD_S)), "c:1": (0, 0.0)}
    tracker.observe("a:1", False, 6, {}, now_s=20.0)
    assert counters.snapshot().followers == () and counters.snapshot().leader_changes == 3
