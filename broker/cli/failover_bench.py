"""Failover benchmark: ``raftbroker bench failover`` and :func:`run_failover_bench`.

Each trial starts from a healthy cluster with a client publishing; it kills the leader with
SIGKILL and measures the time from the kill to the first publish acknowledged afterwards (the
client finds the new leader by itself), then restarts the killed node and waits for the cluster to
agree on a leader again. Run against a temporary local cluster that the benchmark starts itself.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated

import typer

from broker.cli.context import JsonFlag, emit_json, fail, reported_errors, state
from broker.cli.terminate import EXIT_TERMINATED, Terminated, sigterm_unwinds


@dataclass(frozen=True)
class FailoverResult:
    """Seconds from kill -9 of the leader to the first acknowledged publish, per trial."""

    trials: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.trials)

    @property
    def max_s(self) -> float:
        return max(self.trials)


def run_failover_bench(trials: int, nodes: int = 3, data_dir: Path | None = None,
                       ready_timeout_s: float = 60.0) -> FailoverResult:
    """Kill the leader ``trials`` times; the cluster lives in ``data_dir`` (default: a temp dir)."""
    from broker.client import Client
    from broker.devcluster import DevCluster

    if nodes < 3:
        raise ValueError("failover needs at least 3 nodes")
    with tempfile.TemporaryDirectory(prefix="raftbroker-failover-") as tmp:
        cluster = DevCluster(nodes, data_dir or Path(tmp)).start()
        try:
            cluster.wait_ready(ready_timeout_s)
            times: list[float] = []
            with Client(cluster.addresses, retry_deadline_s=60) as client:
                client.create_topic("failover-bench")
                for _ in range(trials):
                    client.publish("failover-bench", b"warm")  # the client knows the current leader
                    leader = cluster.leader()
                    assert leader is not None
                    killed_at = time.perf_counter()
                    cluster.kill(leader)
                    client.publish("failover-bench", b"after-kill")
                    times.append(time.perf_counter() - killed_at)
                    cluster.spawn(leader)
                    cluster.wait_ready(ready_timeout_s)
            return FailoverResult(times)
        finally:
            cluster.stop()


def failover_command(
    ctx: typer.Context,
    trials: Annotated[int, typer.Option(min=1, max=100, help="How many times to kill the leader.")] = 5,
    nodes: Annotated[int, typer.Option(min=3, max=9, help="Nodes of the temporary cluster.")] = 3,
    json_: JsonFlag = False,
) -> None:
    """Kill -9 the leader of a temporary local cluster TRIALS times; report the median and max time
    from the kill to the first acknowledged publish. --json: {"trials": [...], "median_s", "max_s"}.
    Ctrl-C (exit 130) or SIGTERM (exit 143) stops the cluster and removes its data first."""
    with reported_errors():
        try:
            with sigterm_unwinds():
                result = run_failover_bench(trials, nodes)
        except Terminated:
            raise typer.Exit(EXIT_TERMINATED) from None
        except (TimeoutError, RuntimeError) as err:
            fail(f"could not run the failover benchmark: {err}")
    if state(ctx).json:
        emit_json({**asdict(result), "median_s": result.median_s, "max_s": result.max_s})
        return
    print(f"failover over {trials} trial(s): median {result.median_s * 1000:.0f} ms, "
          f"max {result.max_s * 1000:.0f} ms")
    for i, t in enumerate(result.trials, start=1):
        print(f"  trial {i}: {t * 1000:.0f} ms")
