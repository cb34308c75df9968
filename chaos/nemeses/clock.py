"""Clock jumps: shift the node clock (``broker.clock.NodeClock``) of the leader, of a follower or of
every node forward or backward by ~1 s to ~10 min, hold it while the workload runs, set it back.

Each node of a clock drill is started with ``RAFTBROKER_CLOCK_FILE=<its data dir>/clock_offset_ms``
(:data:`CLOCK_ENV`); the node re-reads that file every 50 ms and logs ``clock offset now +N ms``,
which the nemesis waits for, so the history says when each node really jumped. The clock moves
every ``now_ms`` the node stamps (record timestamps, dedup buckets, retention cut-offs, group
leases), not Raft's election timers. Variant ``kill``: after the hold, kill -9 the jumped leader,
so a node with another clock takes over (the timestamps of its records must not go back), then
restart it. Everything is set back in a ``finally``.
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path

from broker.clock import ENV_CLOCK_FILE
from chaos.cluster import NODE_DIR, ChaosCluster
from chaos.nemeses import RECOVERY_TIMEOUT_S, Ctx, NemesisError, Step

CLOCK_FILE_NAME = "clock_offset_ms"
CLOCK_ENV = {ENV_CLOCK_FILE: f"{NODE_DIR}/{CLOCK_FILE_NAME}"}
JUMP_MS_MIN = 1_000
JUMP_MS_MAX = 600_000
APPLY_WAIT_S = 10.0  # the node polls its file every 50 ms; a node still starting reads it when it is up


def clock_jump_step(rng: random.Random, nodes: int) -> Step:
    """One seeded clock-jump step (every choice drawn here, in a fixed order)."""
    target = rng.choice(["leader", "leader", "follower", "all"])
    k = rng.randrange(16)
    magnitude_ms = round(10 ** rng.uniform(math.log10(JUMP_MS_MIN), math.log10(JUMP_MS_MAX)))  # log-uniform
    offset_ms = magnitude_ms * rng.choice([-1, 1])
    hold_s = round(rng.uniform(2.0, 5.0), 2)
    then_kill = rng.random() < 0.5
    down_s = round(rng.uniform(1.0, 3.0), 2)
    quiet_s = round(rng.uniform(1.0, 3.0), 2)
    params: dict[str, object] = {"target": target, "k": k, "offset_ms": offset_ms, "hold_s": hold_s}
    if target == "leader" and then_kill:
        params.update(then="kill", down_s=down_s)
    params["quiet_s"] = quiet_s
    return Step("clock-jump", params)


def clock_file(cluster: ChaosCluster, i: int) -> Path:
    """Node ``i``'s offset file (what :data:`CLOCK_ENV` resolves to for it)."""
    return cluster.node_data_dir(i) / CLOCK_FILE_NAME


def set_clock(cluster: ChaosCluster, i: int, offset_ms: int) -> None:
    """Write node ``i``'s clock offset atomically (a node never reads half a number)."""
    path = clock_file(cluster, i)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{offset_ms}\n")
    os.replace(tmp, path)


def clock_jump(ctx: Ctx, step: Step) -> None:
    """Jump the ``target`` clocks (leader | follower | all) by ``offset_ms`` for ``hold_s``; with
    ``then=kill`` also kill -9 the jumped leader for ``down_s``; then set every clock back."""
    p = step.params
    offset_ms = int(p["offset_ms"])
    targets = _targets(ctx, str(p["target"]), int(p.get("k", 0)))
    marks = {i: ctx.cluster.log_size(i) for i in targets}
    fid: int | None = None
    try:
        for i in targets:
            set_clock(ctx.cluster, i, offset_ms)
        fid = ctx.fault("clock-jump", targets, offset_ms=offset_ms, role=p["target"], hold_s=p["hold_s"],
                        then=p.get("then", "-"))
        ctx.note(fid, jumped=_await_logged(ctx, targets, offset_ms, marks))
        ctx.hold(float(p["hold_s"]))  # from the moment the jump was seen (or the wait gave up)
        if p.get("then") == "kill":
            _kill_jumped_leader(ctx, fid, targets[0], float(p["down_s"]))
    finally:
        down = [i for i in targets if not ctx.cluster.alive(i)]
        running = [i for i in targets if i not in down]
        marks = {i: ctx.cluster.log_size(i) for i in running}
        for i in range(ctx.cluster.nodes):  # every clock, whatever was resolved before a failure
            set_clock(ctx.cluster, i, 0)
        for i in down:  # restarted with its clock set back (read once at start)
            ctx.cluster.spawn(i)
        if fid is not None:
            ctx.heal(fid, "clock-jump", restarted=[ctx.node(i) for i in down])
            if running:
                ctx.note(fid, set_back=_await_logged(ctx, running, 0, marks))


def _targets(ctx: Ctx, role: str, k: int) -> list[int]:
    if role == "leader":
        return [ctx.leader()]
    if role == "follower":
        return [ctx.follower(k)]
    if role == "all":
        return [i for i in range(ctx.cluster.nodes) if ctx.cluster.alive(i)]
    raise NemesisError(f"unknown clock-jump target {role!r}")


def _kill_jumped_leader(ctx: Ctx, fid: int, jumped: int, down_s: float) -> None:
    """kill -9 the node whose clock jumped (if it still leads), wait for a successor, hold ``down_s``
    (the caller restarts it)."""
    if ctx.cluster.current_leader() != jumped:
        ctx.note(fid, kill="skipped: the jumped node no longer leads")
        return
    ctx.cluster.kill(jumped)
    successor = ctx.cluster.wait_leader(RECOVERY_TIMEOUT_S, exclude=[jumped])
    ctx.note(fid, killed=ctx.node(jumped), new_leader="-" if successor is None else ctx.node(successor))
    ctx.hold(down_s)


def _await_logged(ctx: Ctx, targets: list[int], offset_ms: int, marks: dict[int, int]) -> str:
    """Wait until each running target logged its new offset; say which did (``n1 n2``) and which not."""
    line = f"clock offset now {offset_ms:+d} ms".encode()
    pending = {i for i in targets if ctx.cluster.alive(i)}
    seen: list[int] = []
    deadline = time.monotonic() + APPLY_WAIT_S
    while pending and time.monotonic() < deadline and not ctx.abort.is_set():
        for i in sorted(pending):
            if line in ctx.cluster.log_since(i, marks.get(i, 0)):
                pending.discard(i)
                seen.append(i)
        if pending:
            time.sleep(0.02)
    out = " ".join(ctx.node(i) for i in sorted(seen)) or "none"
    return out + (f"; not seen on {' '.join(ctx.node(i) for i in sorted(pending))}" if pending else "")
