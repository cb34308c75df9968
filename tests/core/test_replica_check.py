"""The leader's periodic comparison of apply digests (broker/leader/replica_check.py): due once a
period, remembers what it found, logs a change once."""

from __future__ import annotations

import logging

import pytest

from broker.leader.replica_check import ReplicaCheck

pytestmark = pytest.mark.unit


class Answers:
    def __init__(self) -> None:
        self.differing: list[str] = []
        self.calls = 0
        self.fail = False

    def __call__(self) -> tuple[int, tuple[str, ...]]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("a member kept moving")
        return 10 * self.calls, tuple(self.differing)


def test_compares_once_per_period_and_logs_each_change_once(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    answers = Answers()
    check = ReplicaCheck(answers, 60.0, clock=lambda: now[0])
    check.check_if_due()
    check.check_if_due()
    assert answers.calls == 1 and check.differing == () and check.checked_index == 10
    answers.differing = ["n3"]
    now[0] += 59.0
    check.check_if_due()
    assert answers.calls == 1, "not due yet"
    with caplog.at_level(logging.WARNING, logger="broker.leader.replica_check"):
        now[0] += 1.0
        check.check_if_due()
        now[0] += 60.0
        check.check_if_due()
        assert check.differing == ("n3",) and answers.calls == 3
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "at index 20, n3 decided some command differently" in errors[0].getMessage()
        answers.differing = []
        now[0] += 60.0
        check.check_if_due()
        assert check.differing == () and "replicas agree again at index 40" in caplog.text


def test_a_comparison_that_fails_keeps_the_last_result_and_is_tried_next_period() -> None:
    now = [0.0]
    answers = Answers()
    answers.differing = ["n2"]
    check = ReplicaCheck(answers, 10.0, clock=lambda: now[0])
    check.check_if_due()
    answers.fail = True
    now[0] += 10.0
    with pytest.raises(RuntimeError):
        check.check_if_due()  # the housekeeper logs it and goes on (tests/core/test_housekeeping.py)
    assert check.differing == ("n2",)
    answers.fail, answers.differing = False, []
    check.check_if_due()
    assert answers.calls == 2, "not before the next period"
    now[0] += 10.0
    check.check_if_due()
    assert check.differing == ()
