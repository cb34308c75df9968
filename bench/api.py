"""Entry points for ``raftbroker bench`` subcommands, so the CLI and ``make bench`` share the workload code.

``run_raftbroker(workload, ...)`` runs one workload (``publish``, ``latency``, ``failover``,
``recovery``) ``reps`` times against raftbroker and returns ``{metric: Summary}``. With
``bootstrap`` it uses a running cluster (publish and latency only: failover and recovery must kill
and restart nodes, so they need ``spawn_nodes``); with ``spawn_nodes`` it starts a temporary
cluster, which it stops (by PID) before returning.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench import workloads
from bench.config import FULL, BenchConfig
from bench.stats import Summary, summarize_reps
from bench.systems.base import Deployment, DeploymentInfo, Endpoint, NotAvailable
from bench.systems.raftbroker import RaftbrokerDeployment, RaftbrokerEndpoint

Metrics = dict[str, float]


class AttachedRaftbroker(Deployment):
    """A running cluster reached through ``bootstrap``; it cannot kill or restart nodes."""

    def __init__(self, bootstrap: Sequence[str], durability: str = "disk") -> None:
        self.bootstrap = list(bootstrap)
        self.durability = durability
        self.workdir = Path(".")
        self.info = DeploymentInfo("raftbroker", f"{durability} (attached)", len(self.bootstrap), "?", "", "SDK")

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None

    async def endpoint(self) -> Endpoint:
        return RaftbrokerEndpoint(self.bootstrap, self.durability)

    def failover_unsupported(self) -> str | None:
        return "needs a cluster the benchmark started (--spawn)"

    def server_pgids(self) -> list[int]:
        return []  # not started here (perhaps not on this machine): the publish reports the client's CPU only

    async def leader_node(self, stream: str) -> int:
        raise NotAvailable("the leader of an attached cluster is not controlled by the benchmark")

    def kill_node(self, i: int) -> None:
        raise NotAvailable("an attached cluster's nodes are not killed by the benchmark (use --spawn)")

    def spawn_node(self, i: int) -> None:
        raise NotAvailable("an attached cluster's nodes are not started by the benchmark (use --spawn)")

    async def node_holds(self, i: int, stream: str, records: int) -> bool:
        raise NotAvailable("needs a cluster the benchmark started (--spawn)")


async def _reps(deployment: Deployment, workload: str, config: BenchConfig, size_bytes: int) -> list[Metrics]:
    results: list[Metrics] = []
    if workload == "recovery":
        stream, held = await workloads.fill(deployment, config.recovery_records, config.recovery_fill_cap_s,
                                             config.payload_seed)
    for _ in range(config.reps):
        if workload == "publish":
            results.append(await workloads.publish_consume(deployment, size_bytes, config.publish_records,
                                                           config.publish_cap_s, config.payload_seed))
        elif workload == "latency":
            results.append(await workloads.latency(deployment, size_bytes, config.latency_rate_per_s,
                                                   config.latency_duration_s, config.latency_warmup_s,
                                                   config.payload_seed))
        elif workload == "queue":
            reason = deployment.work_queue_unsupported()
            if reason is not None:
                raise NotAvailable(f"queue: {reason}")
            results.append(await workloads.work_queue(deployment, size_bytes, config.queue_records,
                                                      config.queue_concurrency, config.queue_cap_s,
                                                      config.payload_seed))
        elif workload == "failover":
            reason = deployment.failover_unsupported()
            if reason is not None:
                raise NotAvailable(f"failover: {reason}")
            results.append(await workloads.failover(deployment, config.failover_interval_s,
                                                    config.failover_before_s, config.failover_timeout_s))
        elif workload == "recovery":
            results.append(await workloads.recovery(deployment, stream, held, config.recovery_timeout_s))
        else:
            raise ValueError(f"unknown workload {workload!r}")
    return results


def run_raftbroker(workload: str, *, bootstrap: Sequence[str] | None = None, spawn_nodes: int | None = None,
                   durability: str = "disk", size_bytes: int = 100, config: BenchConfig = FULL) -> dict[str, Summary]:
    """``workload`` repeated ``config.reps`` times; the median, min and max of every metric."""
    if (bootstrap is None) == (spawn_nodes is None):
        raise ValueError("give either bootstrap (a running cluster) or spawn_nodes (a temporary one)")
    if bootstrap is not None:
        return summarize_reps(asyncio.run(_reps(AttachedRaftbroker(bootstrap, durability), workload, config,
                                                size_bytes)))
    assert spawn_nodes is not None
    with tempfile.TemporaryDirectory(prefix="raftbroker-bench-") as tmp:
        deployment = RaftbrokerDeployment(spawn_nodes, durability, Path(tmp))
        try:
            deployment.start()
            return summarize_reps(asyncio.run(_reps(deployment, workload, config, size_bytes)))
        finally:
            deployment.stop()
