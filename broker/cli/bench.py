"""Publish benchmark: ``raftbroker bench publish`` and :func:`run_publish_bench` (for ``make bench``).

For each batch size, ``count`` records of ``size_bytes`` bytes are published in batches (or as
many as fit in ``run_s_max`` seconds), first one batch at a time (sequential), then from
``threads`` threads sharing one client (concurrent).
A record counts once its Publish is acknowledged (committed by a majority). Latency is per
Publish call. The benchmark topic is created (and dropped afterwards) unless one is given.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from broker.cli.context import BootstrapOption, JsonFlag, emit_json, fail, reported_errors, state

if TYPE_CHECKING:  # the SDK is imported by the commands that use it: the CLI starts fast
    from broker.client import Client

app = typer.Typer(help="Measure the cluster.", no_args_is_help=True)


@dataclass(frozen=True)
class BenchResult:
    """Acknowledged throughput and Publish latency of one (mode, batch size) run."""

    mode: str  # "sequential" | "concurrent"
    batch_size: int
    threads: int
    records: int
    duration_s: float
    msgs_per_s: float
    p50_ms: float
    p99_ms: float


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def _timed_batches(client: Client, topic: str, batch: list[bytes], batches: int, deadline: float) -> list[float]:
    latencies = []
    for _ in range(batches):
        t0 = time.perf_counter()
        if t0 >= deadline:
            break
        client.publish_batch(topic, batch)
        latencies.append(time.perf_counter() - t0)
    return latencies


def _measure(client: Client, topic: str, mode: str, batch_size: int, count: int, threads: int,
             payload: bytes, run_s_max: float) -> BenchResult:
    batch = [payload] * batch_size
    batches = max(1, math.ceil(count / batch_size))
    workers = threads if mode == "concurrent" else 1
    shares = [batches // workers + (1 if i < batches % workers else 0) for i in range(workers)]
    started = time.perf_counter()
    deadline = started + run_s_max
    with ThreadPoolExecutor(max_workers=workers) as pool:
        parts = list(pool.map(lambda n: _timed_batches(client, topic, batch, n, deadline), [s for s in shares if s]))
    duration = time.perf_counter() - started
    latencies = sorted(lat for part in parts for lat in part)
    records = len(latencies) * batch_size
    return BenchResult(
        mode=mode,
        batch_size=batch_size,
        threads=workers,
        records=records,
        duration_s=round(duration, 4),
        msgs_per_s=round(records / duration, 1) if duration > 0 else 0.0,
        p50_ms=round(percentile(latencies, 0.50) * 1000, 3),
        p99_ms=round(percentile(latencies, 0.99) * 1000, 3),
    )


def run_publish_bench(
    bootstrap: Sequence[str],
    *,
    count: int = 5000,
    batch_sizes: Sequence[int] = (1, 100, 1000),
    size_bytes: int = 100,
    topic: str | None = None,
    threads: int = 8,
    partitions: int = 1,
    durability: str | None = None,
    run_s_max: float = 10.0,
    timeout_s: float = 10.0,
    retry_deadline_s: float = 30.0,
    on_result: Callable[[BenchResult], None] | None = None,
    client_config: str | None = None,
) -> list[BenchResult]:
    """Run the benchmark against a running cluster; one result per (batch size, mode).

    Each run publishes ``count`` records or stops starting batches after ``run_s_max`` seconds,
    whichever comes first (``records`` in the result says how many were acknowledged)."""
    assert count > 0 and size_bytes >= 0 and threads > 0 and all(b > 0 for b in batch_sizes)
    assert run_s_max > 0
    payload = os.urandom(size_bytes)
    own_topic = topic is None
    name = topic or f"bench-{uuid.uuid4().hex[:8]}"
    results = []
    from broker.client import Client, TopicExists

    with Client(bootstrap, timeout_s=timeout_s, retry_deadline_s=retry_deadline_s,
                client_config=client_config) as client:
        if own_topic:
            with contextlib.suppress(TopicExists):
                client.create_topic(name, partitions, durability=durability)
        else:
            client.describe_topic(name)  # a given topic must exist: it was created, filled and left behind
        try:
            client.publish_batch(name, [payload])  # warm-up: channels and the leader are found
            for batch_size in batch_sizes:
                for mode in ("sequential", "concurrent"):
                    result = _measure(client, name, mode, batch_size, count, threads, payload, run_s_max)
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
        finally:
            if own_topic:
                client.drop_topic(name)
    return results


@contextlib.contextmanager
def spawned_cluster(nodes: int = 3, ready_timeout_s: float = 60.0) -> Iterator[list[str]]:
    """A temporary local cluster in a temp dir, stopped and deleted on exit; yields its addresses."""
    from broker.devcluster import DevCluster  # imported late: only --spawn needs it

    with tempfile.TemporaryDirectory(prefix="raftbroker-bench-") as tmp, DevCluster(nodes, Path(tmp)) as cluster:
        cluster.wait_ready(ready_timeout_s)
        yield cluster.addresses


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(s < 1 or s > 10_000 for s in sizes):
        raise typer.BadParameter(f"{text!r}: give comma-separated sizes from 1 to 10000", param_hint="--batch-sizes")
    return sizes


@app.command("publish")
def publish(
    ctx: typer.Context,
    count: Annotated[int, typer.Option(min=1, help="Records per batch size and mode (at least one whole "
                                                   "batch: rounded up to a multiple of the batch size).")] = 5000,
    batch_sizes: Annotated[str, typer.Option(help="Comma-separated records per Publish.")] = "1,100,1000",
    size: Annotated[int, typer.Option(min=0, max=1_000_000, help="Bytes per record value.")] = 100,
    topic: Annotated[str | None, typer.Option(help="An existing topic to use (default: a temporary one, "
                                                   "dropped afterwards).")] = None,
    threads: Annotated[int, typer.Option(min=1, max=64, help="Threads of the concurrent variant.")] = 8,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions of the temporary topic.")] = 1,
    durability: Annotated[str | None, typer.Option(help="Durability class of the temporary topic: ephemeral, "
                                                   "memory, disk (the default) or fsync.", show_default=False)] = None,
    max_seconds: Annotated[
        float, typer.Option(min=0.1, help="Stop a run after this many seconds even if COUNT is not reached.")
    ] = 10.0,
    spawn: Annotated[bool, typer.Option("--spawn", help="Start a temporary 3-node cluster for the run.")] = False,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Acknowledged msgs/s and p50/p99 Publish latency per batch size, sequential and concurrent.

    --json: {"config": {...}, "results": [{"mode", "batch_size", "threads", "records",
    "duration_s", "msgs_per_s", "p50_ms", "p99_ms"}]}.
    """
    sizes = _parse_sizes(batch_sizes)
    opts = state(ctx)
    console = Console(stderr=True)
    if durability is not None and topic is not None:
        raise typer.BadParameter("--durability applies to the temporary topic: drop --topic", param_hint="--durability")
    config = {"count": count, "batch_sizes": sizes, "size_bytes": size, "threads": threads,
              "max_seconds": max_seconds, "spawn": spawn, "durability": durability or "disk"}

    def progress(result: BenchResult) -> None:
        if not opts.json:
            console.print(f"  {result.mode:<10} batch {result.batch_size:>5}: {result.msgs_per_s:>10,.0f} msg/s")

    with reported_errors(), contextlib.ExitStack() as stack:
        if spawn:
            try:
                bootstrap: Sequence[str] = stack.enter_context(spawned_cluster())
            except (TimeoutError, RuntimeError) as err:
                fail(f"could not start a cluster: {err}")
        else:
            bootstrap = opts.bootstrap
        results = run_publish_bench(
            bootstrap, count=count, batch_sizes=sizes, size_bytes=size, topic=topic,
            threads=threads, partitions=partitions, durability=durability, run_s_max=max_seconds,
            timeout_s=opts.timeout_s, retry_deadline_s=max(opts.retry_deadline_s, 30.0), on_result=progress,
            client_config=None if spawn else opts.client_config,
        )
    if opts.json:
        emit_json({"config": config, "results": [asdict(r) for r in results]})
        return
    table = Table("mode", "batch", "threads", "records", "msgs/s", "p50 ms", "p99 ms", box=None)
    for r in results:
        table.add_row(r.mode, str(r.batch_size), str(r.threads), str(r.records), f"{r.msgs_per_s:,.0f}",
                      f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}")
    Console().print(table)
