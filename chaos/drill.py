"""One drill: a local cluster started for the run, workloads, a seeded fault schedule, healing,
a final read of every node, and the checker's report.

Order: seed and schedule printed → cluster on its fabric → availability probes → topic → status
polls, producers, readers, consumer groups → faults until the duration is used → heal everything →
wait until a publish invoked after the last heal is acknowledged → stop and settle producers (group
members stop crashing) → wait until the nodes converge → final read of every partition on every
node → readers catch up, groups drain (both bounded) and stop → teardown (every node killed by
PID, the fabric removed) → checker. Teardown runs also on failure and on an interrupt (Ctrl-C; the
command turns SIGTERM into one too, ``chaos.cli``).
"""

from __future__ import annotations

import json
import random
import secrets
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.client import BrokerError, Client
from chaos.checkers import Report, check
from chaos.cluster import ChaosCluster
from chaos.history import History
from chaos.nemeses import RECOVERY_TIMEOUT_S, Ctx, NemesisError
from chaos.net import Fabric, make_fabric, netns_unavailable
from chaos.reads import read_partition
from chaos.scenarios import NEMESES, SCENARIOS, Scenario
from chaos.workloads.groups import WORKLOAD as GROUPS
from chaos.workloads.groups import GroupWorkload
from chaos.workloads.producers import Producer
from chaos.workloads.readers import Reader
from chaos.workloads.status import StatusPoller

TOPIC = "chaos"
START_TIMEOUT_S = 60.0
TAIL_AFTER_HEAL_S = 2.0
READER_CATCH_UP_S = 20.0
Echo = Callable[[str], None]


@dataclass(frozen=True)
class DrillOptions:
    """One run. ``network``: auto | netns | proxy | loopback (see ``chaos.net``)."""

    scenario: str
    seed: int
    duration_s: float = 30.0
    nodes: int = 3
    network: str = "auto"
    out_dir: Path | None = None
    producers: int = 3
    partitions: int = 3
    readers: bool = True
    groups: bool = True  # the consumer-group workload (chaos.workloads.groups)
    recovery_timeout_s: float = 60.0


class DrillError(RuntimeError):
    """The drill itself could not run (the cluster did not start); not a verdict on the broker."""


def run_drill(opts: DrillOptions, echo: Echo = print) -> Report:
    """Run one scenario; return the checker's report (also written to ``<out>/report.json``)."""
    scenario = SCENARIOS[opts.scenario]
    echo(f"drill {scenario.name} seed={opts.seed} duration={opts.duration_s:g}s nodes={opts.nodes}: {scenario.summary}")
    if scenario.unavailable is not None:
        echo(f"  not available: {scenario.unavailable}")
        return Report(scenario.name, opts.seed, available=False, reason=scenario.unavailable)
    network = opts.network
    if network == "auto":
        network = "netns" if netns_unavailable() is None else "proxy"
    if scenario.needs_link_faults and network == "loopback":
        reason = "needs link faults: use --network netns or proxy"
        echo(f"  not available: {reason}")
        return Report(scenario.name, opts.seed, available=False, reason=reason)
    rng = random.Random(opts.seed)
    out = opts.out_dir or Path(tempfile.mkdtemp(prefix=f"raftbroker-drill-{scenario.name}-{opts.seed}-"))
    out.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(3)  # names of this run's namespaces: infrastructure, not a drill choice
    fabric = make_fabric(network, opts.nodes, run_id, seed=rng.getrandbits(32))
    try:  # the fabric goes also when the cluster could not even be set up on it, or on an interrupt
        history = History(out / "history.jsonl")
        try:
            _run(scenario, opts, rng, fabric, history, out, echo)
        finally:
            history.close()
    finally:
        fabric.close()
    report = check(history.entries, scenario.name, opts.seed)
    unavailable = next((e.value["reason"] for e in history.entries if e.f == "scenario-unavailable"), None)
    if unavailable is not None:
        report.available, report.reason = False, str(unavailable)
    report.artifacts = {"dir": str(out), "history": str(out / "history.jsonl"), "report": str(out / "report.json"),
                        "node_logs": str(out / "cluster")}
    (out / "report.json").write_text(json.dumps(report.to_json(), indent=2))
    return report


def _run(scenario: Scenario, opts: DrillOptions, rng: random.Random, fabric: Fabric, history: History, out: Path,
         echo: Echo) -> None:
    cluster = ChaosCluster(opts.nodes, out / "cluster", fabric, node_env=scenario.node_env)
    stop = threading.Event()
    abort = threading.Event()
    producers: list[Producer] = []
    readers: list[Reader] = []
    poller: StatusPoller | None = None
    groups: GroupWorkload | None = None
    try:
        cluster.start()
        if cluster.wait_leader(START_TIMEOUT_S) is None:
            raise DrillError(f"no leader within {START_TIMEOUT_S:g} s; see {out / 'cluster'}/*.log")
        if scenario.probe is not None:
            reason = scenario.probe(cluster.addresses)
            if reason is not None:
                echo(f"  not available: {reason}")
                history.info("drill", "scenario-unavailable", {"reason": reason})
                return
        plan = scenario.plan(rng, opts.duration_s, opts.nodes)
        history.info("drill", "run", {"scenario": scenario.name, "seed": opts.seed, "duration_s": opts.duration_s,
                                      "nodes": opts.nodes, "network": fabric.name, "run_id": run_id_of(fabric),
                                      "schedule": [s.describe() for s in plan]})
        echo(f"  network: {fabric.name}; data and logs: {out}")
        echo("  schedule: " + "; ".join(s.describe() for s in plan))

        def make_client() -> Client:
            return Client(cluster.addresses, timeout_s=5.0, retry_deadline_s=20.0)

        with make_client() as admin:
            admin.create_topic(TOPIC, partitions=opts.partitions, dedup_window_ms=-1, durability=scenario.durability)
        poller = StatusPoller(cluster, history).start()
        producers = [Producer(f"p{k}", make_client, TOPIC, opts.partitions, history,
                              random.Random(rng.getrandbits(64)), stop, session=k % 2 == 1)
                     for k in range(opts.producers)]
        readers = [Reader(f"r{p}", make_client, TOPIC, p, history) for p in range(opts.partitions)] \
            if opts.readers else []
        for t in [*producers, *readers]:
            t.start()
        if opts.groups:
            groups = GroupWorkload(make_client, TOPIC, opts.partitions, history, random.Random(rng.getrandbits(64)),
                                   calm=stop)
            why = groups.start()
            if why is not None:
                echo(f"  workload {GROUPS}: not available: {why}")
        ctx = Ctx(cluster, history, abort, topics={TOPIC: opts.partitions}, echo=echo)
        for step in plan:
            if history.now() >= opts.duration_s:
                break
            try:
                NEMESES[step.kind](ctx, step)
            except NemesisError as err:
                history.info("nemesis", "nemesis-error", {"step": step.describe(), "error": str(err)})
                echo(f"  nemesis could not run as planned: {err}")
            cluster.wait_leader(RECOVERY_TIMEOUT_S)
            ctx.hold(float(step.params.get("quiet_s", 1.0)))
        _heal_all(ctx)
        healed_at = history.now()
        _await_recovery(producers, history, healed_at, opts.recovery_timeout_s)
        stop.set()
        for p in producers:
            p.join(60)
            p.settle()
        writes_stopped_at = history.now()  # convergence is waited for only now: until then the index moves
        applied = cluster.wait_converged(opts.recovery_timeout_s)
        history.info("drill", "converged", {
            "applied_index": applied, "after_heal_s": None if applied is None else history.now() - healed_at,
            "after_writes_stopped_s": None if applied is None else history.now() - writes_stopped_at})
        _verify_replicas(cluster, history)
        ends = _final_reads(cluster, history, opts.partitions)
        _await_readers(readers, ends)
        if groups is not None:
            for group in groups.await_drained(ends):
                echo(f"  workload {GROUPS}: group {group} did not drain within the bound")
    finally:
        try:
            stop.set()
            abort.set()
            for r in readers:
                r.halt()
            for p in producers:
                p.join(30)
                p.close()
            for r in readers:
                r.join(30)
                r.close()
            if groups is not None:
                groups.halt()
            if poller is not None:
                poller.stop()
        finally:  # the nodes are killed whatever broke (or interrupted) the workloads' teardown
            cluster.stop()


def run_id_of(fabric: Fabric) -> str:
    return str(getattr(fabric, "run_id", ""))


def _heal_all(ctx: Ctx) -> None:
    """Undo whatever a fault left (normally nothing: every nemesis heals its own)."""
    ctx.cluster.fabric.heal()
    paused = sorted(ctx.cluster.paused)
    for i in paused:
        ctx.cluster.resume(i)
    dead = ctx.restart_dead()
    ctx.history.info("nemesis", "heal-all", {"resumed": [ctx.node(i) for i in paused],
                                             "restarted": [ctx.node(i) for i in dead]})


def _await_recovery(producers: list[Producer], history: History, healed_at: float, timeout_s: float) -> None:
    """Let the workload run until a publish invoked after the heal is acknowledged (and a little more)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not any(p.last_ok_invoke >= healed_at for p in producers):
        time.sleep(0.05)
    tail_end = time.monotonic() + TAIL_AFTER_HEAL_S
    while time.monotonic() < min(tail_end, deadline):
        time.sleep(0.05)


def _verify_replicas(cluster: ChaosCluster, history: History) -> None:
    """Every node's digest of apply outcomes at one index (``VerifyReplicas``), into the history
    (the ``apply-divergence`` check)."""
    try:
        with Client(cluster.addresses, timeout_s=10.0, retry_deadline_s=20.0) as client:
            found = client.verify_replicas()
    except BrokerError as err:
        history.info("checker", "apply-digests", {"error": str(err)})
        return
    history.info("checker", "apply-digests", {
        "index": found.index, "agreed": found.agreed, "differing": list(found.differing),
        "digests": {n.id: f"{n.digest:08x}" for n in found.nodes if n.digest is not None},
        "errors": {n.id: n.error for n in found.nodes if n.digest is None}})


def _final_reads(cluster: ChaosCluster, history: History, partitions: int) -> dict[int, int]:
    """Read every partition from every node into the history; return the end offset per partition."""
    leader = cluster.current_leader()
    ends: dict[int, int] = {}
    for i in range(cluster.nodes):
        for p in range(partitions):
            read = read_partition(cluster.grpc_address(i), TOPIC, p)
            history.info("checker", "final-read", {
                "node": cluster.node_id(i), "topic": TOPIC, "partition": p, "leader": i == leader,
                "records": [[o, v] for o, v in read.records], "timestamps_ms": read.timestamps_ms,
                "events": read.events, "error": read.error})
            if read.records:
                ends[p] = max(ends.get(p, 0), read.records[-1][0] + 1)
    return ends


def _await_readers(readers: list[Reader], ends: dict[int, int]) -> None:
    deadline = time.monotonic() + READER_CATCH_UP_S
    while time.monotonic() < deadline and any(r.next_offset < ends.get(r.partition, 0) for r in readers):
        time.sleep(0.05)
