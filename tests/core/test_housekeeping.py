"""Leader housekeeping (broker/leader/housekeeping.py): the tasks run at once when a node becomes
the leader, then once a period, never on a follower; a failing task stops neither the others nor
the thread."""

from __future__ import annotations

import logging

import pytest

from broker.core.errors import NotLeader
from broker.leader.housekeeping import Housekeeper

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
