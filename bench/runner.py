"""Runs every configured system through every workload and collects the results (a JSON-able dict).

Failures are never silent: a system that cannot be installed or started, or a variant that does not
exist yet, is reported with its reason; a workload that fails is reported with its error and the
run goes on with the next one. Every deployment is stopped (by PID) before the next one starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import profile, workloads
from bench.config import BenchConfig
from bench.stats import summarize_reps
from bench.systems.base import Deployment, NotAvailable

Json = dict[str, Any]


def log(message: str) -> None:
    """Progress on stderr with the wall time."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> Json:
    """What the figures were measured on."""
    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": os.cpu_count(), "cpu": model, "memory_gib": round(mem_gib, 1),
            "python": platform.python_version(), "kernel": platform.release(),
            "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}


class Factories:
    """Builds each named deployment under ``root``; the RabbitMQ variants share one cluster."""

    def __init__(self, config: BenchConfig, root: Path) -> None:
        self.config = config
        self.root = root
        self._rabbit: Any = None
        self._workdirs: list[Path] = []  # built, not yet removed

    def build(self, name: str) -> Deployment:
        workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
        self._workdirs.append(workdir)
        if name.startswith("raftbroker-"):
            from bench.systems.raftbroker import RaftbrokerDeployment

            _, durability, nodes = name.split("-")
            return RaftbrokerDeployment(int(nodes), durability, workdir)
        if name in ("nats", "nats-dedup"):
            from bench.systems.nats import NatsDeployment

            return NatsDeployment(3, workdir, dedup=name == "nats-dedup")
        if name == "redis":
            from bench.systems.redis import RedisDeployment

            return RedisDeployment(workdir)
        if name.startswith("rabbitmq-"):
            from bench.systems.rabbitmq import RabbitCluster, RabbitDeployment

            if self._rabbit is None:
                self._rabbit = RabbitCluster(3, workdir)
            rabbit_names = [s for s in self.config.systems if s.startswith("rabbitmq-")]
            owns = name == rabbit_names[-1]
            deployment = RabbitDeployment(self._rabbit, name.split("-", 1)[1], owns_cluster=owns)
            if owns:
                self._rabbit = None
            return deployment
        raise ValueError(f"unknown system {name!r}")

    def release(self) -> float:
        """Remove the data of every deployment built so far, bar a RabbitMQ cluster that a later variant
        still uses; return the seconds it took. Run after each system stops, so that every system starts
        on the same machine: on this VM, the page cache that a stopped system's files still hold made the
        next system's buffered writes cost several times the kernel CPU (raftbroker fsync-3 at 1 KiB
        published 39-43k msg/s right after disk-3 and 80-82k once disk-3's files or their cached pages
        were gone; bench/NOTE.md, 2026-12-04 22:00-22:40 UTC)."""
        started = time.monotonic()
        in_use = self._rabbit.workdir if self._rabbit is not None else None
        for workdir in [w for w in self._workdirs if w != in_use]:
            shutil.rmtree(workdir, ignore_errors=True)
            self._workdirs.remove(workdir)
        return round(time.monotonic() - started, 2)


def _run_reps(name: str, reps: int, one: Callable[[], Json]) -> Json:
    """``reps`` repetitions of ``one``; the first failure ends the workload and is reported."""
    results: list[dict[str, float]] = []
    entry: Json = {"reps": results}
    for rep in range(reps):
        try:
            results.append(one())
        except Exception as err:  # noqa: BLE001 (reported, never swallowed)
            log(f"  {name} rep {rep + 1} failed: {err!r}")
            traceback.print_exc(file=sys.stderr)
            entry["error"] = f"{type(err).__name__}: {err}"
            break
    entry["summary"] = {k: s.to_json() for k, s in summarize_reps(results).items()} if results else {}
    return entry


def run_system(name: str, deployment: Deployment, config: BenchConfig, out_dir: Path) -> Json:
    """Every workload on one started deployment."""
    result: Json = {"workloads": {}}
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    try:
        # Latency first: on the freshly started cluster, before the throughput runs fill it.
        if "latency" in config.workloads:
            log(f"  latency at {config.latency_rate_per_s:g}/s for {config.latency_duration_s:g} s")
            result["workloads"]["latency"] = _run_reps("latency", config.reps, lambda: run(workloads.latency(
                deployment, config.latency_size_bytes, config.latency_rate_per_s, config.latency_duration_s,
                config.latency_warmup_s, config.payload_seed)))
        if "publish" in config.workloads:
            for size in config.record_sizes:
                log(f"  publish+consume {size} B × {config.publish_records}")

                def one(size: int = size) -> Json:
                    return run(workloads.publish_consume(deployment, size, config.publish_records,
                                                         config.publish_cap_s, config.payload_seed))

                result["workloads"][f"publish_{size}"] = _run_reps(f"publish_{size}", config.reps, one)
        if "queue" in config.workloads:
            reason = deployment.work_queue_unsupported()
            if reason is not None:
                result["workloads"]["queue"] = {"reps": [], "summary": {}, "skipped": reason}
            else:
                log(f"  work queue: {config.queue_records} records, {config.queue_concurrency} in flight")
                result["workloads"]["queue"] = _run_reps("queue", config.reps, lambda: run(workloads.work_queue(
                    deployment, config.queue_size_bytes, config.queue_records, config.queue_concurrency,
                    config.queue_cap_s, config.payload_seed)))
        if config.profile_s > 0 and name == "raftbroker-disk-3":
            result["profile"] = run(_profile(deployment, config, out_dir))
        if "failover" in config.workloads:
            reason = deployment.failover_unsupported()
            if reason is not None:
                result["workloads"]["failover"] = {"reps": [], "summary": {}, "skipped": reason}
            else:
                log("  failover")
                result["workloads"]["failover"] = _run_reps("failover", config.reps, lambda: run(workloads.failover(
                    deployment, config.failover_interval_s, config.failover_before_s, config.failover_timeout_s)))
        if "recovery" in config.workloads:
            log(f"  recovery: filling {config.recovery_records} records")
            result["workloads"]["recovery"] = _recovery(deployment, config, run)
    finally:
        loop.close()
    return result


def _recovery(deployment: Deployment, config: BenchConfig, run: Callable[[Any], Any]) -> Json:
    try:
        stream, held = run(workloads.fill(deployment, config.recovery_records, config.recovery_fill_cap_s,
                                      config.payload_seed))
    except Exception as err:  # noqa: BLE001 (reported)
        traceback.print_exc(file=sys.stderr)
        return {"reps": [], "summary": {}, "error": f"fill failed: {type(err).__name__}: {err}"}
    log(f"  recovery: {held} records held; restarting a node")
    entry = _run_reps("recovery", config.reps, lambda: run(
        workloads.recovery(deployment, stream, held, config.recovery_timeout_s)))
    entry["records_held"] = held
    return entry


async def _profile(deployment: Deployment, config: BenchConfig, out_dir: Path) -> Json:
    """py-spy on the leader while it takes a 100-byte publish run; the hot spots go into the results."""
    from bench.systems.raftbroker import RaftbrokerDeployment

    assert isinstance(deployment, RaftbrokerDeployment)
    leader = await deployment.leader_node("")
    pid = deployment.cluster.pids[leader]
    assert pid is not None
    folded = out_dir / "profile-raftbroker-leader.txt"
    folded_gil = out_dir / "profile-raftbroker-leader-gil.txt"
    log(f"  profiling the leader (pid {pid}) for {config.profile_s:g} s with py-spy")
    spies = [profile.start_profiler(pid, config.profile_s, folded),
             profile.start_profiler(pid, config.profile_s, folded_gil, gil_only=True)]
    await asyncio.sleep(0.5)
    metrics = await workloads.publish_consume(deployment, 100, 10_000_000, config.profile_s, config.payload_seed)
    result: Json = {"pid": pid, "publish_msgs_per_s": metrics["publish_msgs_per_s"]}
    for spy, path, key in zip(spies, (folded, folded_gil), ("all", "gil"), strict=True):
        _, err = await asyncio.to_thread(spy.communicate)
        if spy.returncode != 0 or not path.exists():
            result[key] = {"error": f"py-spy failed ({spy.returncode}): {err.decode(errors='replace')[-500:]}"}
            continue
        text = path.read_text()
        samples, by_self = profile.hot_spots(text, 20)
        result[key] = {"samples": samples, "folded": path.name, "by_self": [vars(s) for s in by_self],
                       "by_total": [vars(s) for s in profile.top_inclusive(text, 25)]}
    return result


def run_all(config: BenchConfig, out_dir: Path) -> Json:
    """Every system in ``config.systems``; returns the results document."""
    started = time.monotonic()
    out_dir.mkdir(parents=True, exist_ok=True)  # the profile's folded stacks are written there during the run
    document: Json = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": machine(),
                      "config": config.to_json(), "systems": []}
    with tempfile.TemporaryDirectory(prefix="raftbroker-bench-") as tmp:
        os.chmod(tmp, 0o711)  # RabbitMQ runs as its own user and must reach its data below
        factories = Factories(config, Path(tmp))
        for name in config.systems:
            document["systems"].append(_one_system(name, factories, config, out_dir))
    document["duration_s"] = round(time.monotonic() - started, 1)
    return document


def settle_disk() -> float:
    """Write back every dirty page (``sync``) and return how long it took; run before each system,
    so that none starts while the previous one's writes are still in flight (an fsync on ext4
    commits the file system's journal with every other file's pending metadata). A precaution: the
    extra CPU per record a system showed after others had run came from the page cache their files
    held, which :meth:`Factories.release` now frees (bench/NOTE.md, 2026-11-29 and 2026-12-04)."""
    started = time.monotonic()
    os.sync()
    return round(time.monotonic() - started, 2)


def _one_system(name: str, factories: Factories, config: BenchConfig, out_dir: Path) -> Json:
    entry: Json = {"name": name, "status": "ok"}
    entry["sync_before_s"] = settle_disk()
    log(f"{name}: starting (after {entry['sync_before_s']:g} s writing back the page cache)")
    deployment: Deployment | None = None
    t0 = time.monotonic()
    try:
        deployment = factories.build(name)
        entry["info"] = vars(deployment.info) | {"key": deployment.info.key}
        deployment.start()
        entry["start_s"] = round(time.monotonic() - t0, 2)
        entry.update(run_system(name, deployment, config, out_dir))
    except NotAvailable as err:
        log(f"{name}: not available: {err}")
        entry.update(status="not available", reason=str(err))
    except Exception as err:  # noqa: BLE001 (reported; the run goes on)
        traceback.print_exc(file=sys.stderr)
        entry.update(status="error", reason=f"{type(err).__name__}: {err}")
    finally:
        if deployment is not None:
            deployment.stop()
        entry["data_removed_s"] = factories.release()
    entry["elapsed_s"] = round(time.monotonic() - t0, 1)
    log(f"{name}: {entry['status']} in {entry['elapsed_s']:g} s")
    return entry
