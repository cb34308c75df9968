"""What gRPC health reports for a real replicator (``broker.services.health``): SERVING for a
leader with its quorum; NOT_SERVING with the reason for a halted Raft and for a node that knows
no leader."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from broker.replication.raft import DUMP_FILE_NAME, PysyncobjReplicator
from broker.services.health import replica_health

from .chain_sm import ChainStateMachine, damage_kept_checkpoint
from .cluster import wait_until
from .conftest import FAST_OPTIONS, Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_a_single_node_leader_is_serving(single_node: Callable[..., Any]) -> None:
    rep, _ = single_node()
    wait_until(lambda: replica_health(rep) == (True, ""), 5, "the leader to be healthy")


def test_a_member_that_never_heard_a_leader_is_not_serving(single_node: Callable[..., Any]) -> None:
    rep, _ = single_node(peers=2, wait_leader=False)  # its two peers never start
    serving, why = replica_health(rep)
    assert not serving and why.startswith("no leader"), why


def test_a_halted_raft_is_not_serving(single_node: Callable[..., Any]) -> None:
    """A snapshot that cannot be restored halts the replicator (see test_snapshot): health says so."""
    rep, sm = single_node()
    outcomes = Outcomes()
    for i in range(5):
        rep.submit(b"cmd %d" % i, outcomes.callback(i))
    outcomes.wait(5)
    rep.force_compaction()
    dump = rep.data_dir / DUMP_FILE_NAME
    wait_until(lambda: dump.exists(), 5, "the snapshot file")
    rep.close()
    sm.close()
    damage_kept_checkpoint(rep.data_dir)
    shutil.rmtree(sm.log_path.parent)
    fresh = ChainStateMachine(sm.log_path.parent)
    again = PysyncobjReplicator(rep.status().self_address, [], rep.data_dir, fresh, FAST_OPTIONS)
    again.start()
    try:
        wait_until(lambda: again.failure is not None, 5, "the restore to fail")
        serving, why = replica_health(again)
        assert not serving and why.startswith("Raft halted:"), why
    finally:
        again.close()
        fresh.close()
