"""The Replicator contract, run against every implementation (in-process, single node)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.replication import FailReason, Replicator, Role

from .chain_sm import ChainStateMachine
from .cluster import wait_until
from .conftest import Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture(params=["memory", "pysyncobj"])
def replicator(request: pytest.FixtureRequest, tmp_path: Path,
               single_node: Callable[..., Any]) -> Iterator[tuple[Replicator, ChainStateMachine]]:
    if request.param == "memory":
        from broker.replication.memory import InMemoryReplicator

        sm = ChainStateMachine(tmp_path / "memory-sm")
        rep = InMemoryReplicator(sm, max_command_bytes=4 * 1024 * 1024)
        rep.start()
        yield rep, sm
        rep.close()
        sm.close()
    else:
        yield single_node()


def test_submits_apply_in_order_with_increasing_indexes(replicator: tuple[Replicator, ChainStateMachine]) -> None:
    rep, sm = replicator
    outcomes = Outcomes()
    for i in range(50):
        rep.submit(b"cmd-%d" % i, outcomes.callback(i))
    outcomes.wait(50)
    assert outcomes.duplicates == 0
    assert all(error is None for _, error in outcomes.results.values())
    indexes = [outcomes.index(i) for i in range(50)]
    assert indexes == sorted(indexes) and len(set(indexes)) == 50
    assert sm.applied_index() == indexes[-1]
    wait_until(lambda: rep.status().applied_index >= indexes[-1], 5, "status to catch up")


def test_status_reports_a_leader_with_quorum(replicator: tuple[Replicator, ChainStateMachine]) -> None:
    rep, _ = replicator
    status = rep.status()
    assert status.role is Role.LEADER
    assert status.leader_address == status.self_address
    assert status.has_quorum and status.term >= 1
    assert status.commit_index >= status.applied_index >= 0


def test_command_above_the_limit_fails_at_once_with_too_large(
        replicator: tuple[Replicator, ChainStateMachine]) -> None:
    rep, sm = replicator
    before = sm.applied_index()
    outcomes = Outcomes()
    rep.submit(b"x" * (4 * 1024 * 1024 + 1), outcomes.callback(0))
    assert outcomes.results[0][1] is not None  # called before submit returned
    assert outcomes.results[0][1].reason is FailReason.TOO_LARGE
    assert sm.applied_index() == before


def test_submit_after_close_fails_with_no_leader(replicator: tuple[Replicator, ChainStateMachine]) -> None:
    rep, _ = replicator
    rep.close()
    outcomes = Outcomes()
    rep.submit(b"late", outcomes.callback(0))
    error = outcomes.results[0][1]
    assert error is not None and error.reason is FailReason.NO_LEADER


def test_transfer_leadership_without_peers_is_refused(replicator: tuple[Replicator, ChainStateMachine]) -> None:
    rep, _ = replicator
    assert rep.transfer_leadership() is False


def test_synced_submits_apply_like_plain_ones(replicator: tuple[Replicator, ChainStateMachine]) -> None:
    rep, sm = replicator
    outcomes = Outcomes()
    for i in range(20):
        rep.submit(b"synced-%d" % i, outcomes.callback(i), sync=i % 2 == 0)
    outcomes.wait(20)
    assert all(error is None for _, error in outcomes.results.values())
    indexes = [outcomes.index(i) for i in range(20)]
    assert indexes == sorted(indexes) and sm.applied_index() == indexes[-1]
