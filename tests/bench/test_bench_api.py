"""``bench.api``: the entry point ``raftbroker bench`` subcommands call (argument checks only; the
workloads themselves run in the smoke test)."""

from __future__ import annotations

import asyncio

import pytest

from bench.api import AttachedRaftbroker, run_raftbroker
from bench.systems.base import NotAvailable

pytestmark = pytest.mark.unit


def test_run_raftbroker_needs_exactly_one_of_bootstrap_and_spawn() -> None:
    with pytest.raises(ValueError, match="either bootstrap"):
        run_raftbroker("publish")
    with pytest.raises(ValueError, match="either bootstrap"):
        run_raftbroker("publish", bootstrap=["127.0.0.1:1"], spawn_nodes=3)


def test_an_attached_cluster_refuses_failover_and_node_control() -> None:
    attached = AttachedRaftbroker(["127.0.0.1:1"])
    assert attached.failover_unsupported() is not None
    with pytest.raises(NotAvailable):
        attached.kill_node(0)
    with pytest.raises(NotAvailable):
        asyncio.run(attached.node_holds(0, "t", 1))
