"""Leader housekeeping (broker/leader/housekeeping.py): the tasks run at once when a node becomes
the leader, then once a period, never on a follower; a failing task stops neither the others nor
the thread."""

from __future__ import annotations

import logging

import pytest

from broker.core.errors import NotLeader
from broker.leader.housekeeping import Housekeeper
from broker.leader.replica_check import ReplicaCheck

pytestmark = pytest.mark.unit


def test_tasks_run_on_becoming_leader_then_once_a_period_and_never_on_a_follower() -> None:
    now, leading, runs = [0.0], [False], []
    keeper = Housekeeper([lambda: runs.append(now[0])], lambda: leading[0], 10.0, clock=lambda: now[0])
    keeper.tick()
    assert runs == [], "a follower runs nothing"
    now[0], leading[0] = 1.0, True
    keeper.tick()
    assert runs == [1.0], "at once on becoming the leader, not a period later"
    for t in (1.5, 5.0, 10.9):
        now[0] = t
        keeper.tick()
    assert runs == [1.0]
    now[0] = 11.0
    keeper.tick()
    assert runs == [1.0, 11.0]
    now[0], leading[0] = 12.0, False
    keeper.tick()
    now[0], leading[0] = 13.0, True
    keeper.tick()
    assert runs == [1.0, 11.0, 13.0], "leading again: at once"


def test_a_failing_task_stops_neither_the_others_nor_the_next_period(caplog: pytest.LogCaptureFixture) -> None:
    now, runs = [0.0], []

    def broken() -> None:
        raise RuntimeError("a bug")

    def not_leader() -> None:
        raise NotLeader(None)

    keeper = Housekeeper([broken, not_leader, lambda: runs.append(now[0])], lambda: True, 1.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="broker.leader.housekeeping"):
        keeper.tick()
        now[0] = 1.0
        keeper.tick()
    assert runs == [0.0, 1.0]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "broken failed" in errors[0].getMessage() and errors[0].exc_info
    assert "housekeeping task skipped: this node is not the leader" in caplog.text


def test_on_lead_runs_before_the_tasks_each_time_the_node_becomes_leader_only() -> None:
    now, leading, calls = [0.0], [True], []
    keeper = Housekeeper([lambda: calls.append("task")], lambda: leading[0], 10.0, clock=lambda: now[0],
                         on_lead=[lambda: calls.append("lead")])
    keeper.tick()
    now[0] = 10.0
    keeper.tick()
    assert calls == ["lead", "task", "task"]
    leading[0] = False
    keeper.tick()
    leading[0], now[0] = True, 11.0
    keeper.tick()
    assert calls == ["lead", "task", "task", "lead", "task"]


def test_a_node_leading_again_compares_replicas_at_once() -> None:
    """The leader's replica comparison has a period of its own (60 s by default): a node that
    leads again compares at once instead of exporting what it found when it last led."""
    now, leading = [0.0], [True]
    answers: list[tuple[str, ...]] = [("n3",)]
    check = ReplicaCheck(lambda: (1, answers[0]), 60.0, clock=lambda: now[0])
    keeper = Housekeeper([check.check_if_due], lambda: leading[0], 1.0, clock=lambda: now[0],
                         on_lead=[check.make_due])
    keeper.tick()
    assert check.differing == ("n3",)
    leading[0] = False
    keeper.tick()
    answers[0] = ()  # repaired while another node led
    leading[0], now[0] = True, 5.0
    keeper.tick()
    assert check.differing == (), "compared at once, not 60 s after the last comparison"


def test_on_step_down_runs_once_each_time_the_node_stops_leading() -> None:
    """A deposed leader held its ephemeral rings (up to max_ephemeral_bytes) until it led again."""
    now, leading, calls = [0.0], [True], []
    keeper = Housekeeper([], lambda: leading[0], 10.0, clock=lambda: now[0],
                         on_step_down=[lambda: calls.append("down")])
    keeper.tick()
    leading[0] = False
    keeper.tick()
    keeper.tick()
    assert calls == ["down"]
    leading[0] = True
    keeper.tick()
    leading[0] = False
    keeper.tick()
    assert calls == ["down", "down"]
