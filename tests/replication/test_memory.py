"""InMemoryReplicator specifics (the shared contract is in test_conformance.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.replication import FailReason, Role
from broker.replication.memory import InMemoryReplicator

from .chain_sm import ChainStateMachine
from .conftest import Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def make(tmp_path: Path, **kwargs: object) -> tuple[InMemoryReplicator, ChainStateMachine]:
    sm = ChainStateMachine(tmp_path / "sm")
    rep = InMemoryReplicator(sm, **kwargs)  # type: ignore[arg-type]
    return rep, sm


def test_callback_runs_before_submit_returns_with_the_state_machine_result(tmp_path: Path) -> None:
    rep, sm = make(tmp_path)
    rep.start()
    outcomes = Outcomes()
    rep.submit(b"a", outcomes.callback(0))
    result, error = outcomes.results[0]
    assert error is None
    assert result == {"index": 1, "chain": sm.chain()[:16]}


def test_indexes_continue_after_the_state_machines_applied_index(tmp_path: Path) -> None:
    rep, sm = make(tmp_path)
    rep.start()
    for i in range(3):
        rep.submit(b"%d" % i, lambda r, e: None)
    rep.close()
    sm.close()
    rep2, sm2 = make(tmp_path)
    rep2.start()
    outcomes = Outcomes()
    rep2.submit(b"after restart", outcomes.callback(0))
    assert outcomes.index(0) == 4
    assert sm2.skipped == 0 and rep2.status().term == 1


def test_step_down_makes_submits_fail_with_not_leader_or_no_leader(tmp_path: Path) -> None:
    rep, sm = make(tmp_path)
    rep.start()
    outcomes = Outcomes()
    rep.step_down("other:1")
    rep.submit(b"x", outcomes.callback(0))
    rep.step_down(None)
    rep.submit(b"y", outcomes.callback(1))
    first, second = outcomes.results[0][1], outcomes.results[1][1]
    assert first is not None and first.reason is FailReason.NOT_LEADER and str(first) == "other:1"
    assert second is not None and second.reason is FailReason.NO_LEADER
    assert rep.status().role is Role.FOLLOWER and sm.applied_index() == 0
    rep.become_leader()
    rep.submit(b"z", outcomes.callback(2))
    assert outcomes.results[2][1] is None and rep.status().term == 2


def test_submit_before_start_fails_with_no_leader(tmp_path: Path) -> None:
    rep, _ = make(tmp_path)
    outcomes = Outcomes()
    rep.submit(b"x", outcomes.callback(0))
    error = outcomes.results[0][1]
    assert error is not None and error.reason is FailReason.NO_LEADER


def test_state_machine_errors_reach_the_submitter_and_do_not_advance_the_index(tmp_path: Path) -> None:
    class Failing(ChainStateMachine):
        def apply(self, index: int, command: bytes | memoryview) -> object:
            if command == b"boom":
                raise RuntimeError("boom")
            return super().apply(index, command)

    sm = Failing(tmp_path / "sm")
    rep = InMemoryReplicator(sm)
    rep.start()
    with pytest.raises(RuntimeError):
        rep.submit(b"boom", lambda r, e: None)
    outcomes = Outcomes()
    rep.submit(b"fine", outcomes.callback(0))
    assert outcomes.index(0) == 1


def test_size_limit_is_configurable(tmp_path: Path) -> None:
    rep, _ = make(tmp_path, max_command_bytes=10)
    rep.start()
    outcomes = Outcomes()
    rep.submit(b"x" * 10, outcomes.callback(0))
    rep.submit(b"x" * 11, outcomes.callback(1))
    assert outcomes.results[0][1] is None
    error = outcomes.results[1][1]
    assert error is not None and error.reason is FailReason.TOO_LARGE


def test_force_compaction_is_counted(tmp_path: Path) -> None:
    rep, _ = make(tmp_path)
    rep.start()
    rep.force_compaction()
    assert rep.compactions == 1
