"""Process faults: kill -9 (leader, follower, a node in an election or in a snapshot install),
SIGSTOP pauses longer than the election timeout, and rolling restarts."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable

from chaos.nemeses import RECOVERY_TIMEOUT_S, Ctx, NemesisError, Step

DUMP_FILE_NAME = "raft.snapshot"  # broker/replication/raft.py; pysyncobj receives into "<dump>.1.tmp"
ELECTION_WATCH_S = 3.0
SNAPSHOT_WAIT_S = 20.0
_SNAPSHOT_WRITTEN = re.compile(rb"(?:wrote|packed) snapshot at index (\d+)")
_SNAPSHOT_RESTORED = re.compile(rb"restored state machine from snapshot at index (\d+)")


def kill(ctx: Ctx, step: Step) -> None:
    """kill -9 the ``target`` (leader | follower); variant ``election`` also kills a second node
    while the others elect a new leader; ``snapshot`` kills a follower in its snapshot install."""
    variant = step.params.get("variant", "plain")
    if variant == "snapshot":
        _kill_in_snapshot_install(ctx, step)
        return
    target = ctx.leader() if step.params["target"] == "leader" else ctx.follower(int(step.params.get("k", 0)))
    victims = [target]
    fid: int | None = None
    try:
        ctx.cluster.kill(target)
        fid = ctx.fault("kill", [target], signal="SIGKILL", variant=variant, down_s=step.params["down_s"])
        if variant == "election":
            second = _kill_during_election(ctx, fid, target, int(step.params.get("k", 0)),
                                           float(step.params.get("election_kill_s", 0.3)))
            if second is not None:
                victims.append(second)
        ctx.hold(float(step.params["down_s"]))
    finally:
        for i in victims:
            if not ctx.cluster.alive(i):
                ctx.cluster.spawn(i)
        if fid is not None:
            ctx.heal(fid, "kill", restarted=[ctx.node(i) for i in victims])


def _kill_during_election(ctx: Ctx, fid: int, old_leader: int, k: int, delay_s: float) -> int | None:
    """Watch the survivors for ``delay_s`` (within the election timeout); kill a candidate as soon
    as one shows, else the ``k``-th survivor when the delay is over. Returns the node killed and
    notes what was seen (a candidate, no leader yet, or a new leader already elected)."""
    survivors = [i for i in range(ctx.cluster.nodes) if i != old_leader and ctx.cluster.alive(i)]
    if not survivors:
        return None
    deadline = time.monotonic() + min(delay_s, ELECTION_WATCH_S)
    victim = survivors[k % len(survivors)]
    seen = "no leader yet"
    while True:
        views = [v for v in (ctx.cluster.view(i, timeout_s=0.1) for i in survivors) if v is not None]
        candidates = [v.index for v in views if v.role == "candidate"]
        if candidates:
            victim, seen = candidates[k % len(candidates)], "candidate"
            break
        if any(v.role == "leader" for v in views):
            seen = "new leader already elected"
        if time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    ctx.cluster.kill(victim)
    ctx.note(fid, second_kill=ctx.node(victim), seen=seen)
    return victim




def _kill_in_snapshot_install(ctx: Ctx, step: Step) -> None:
    """kill -9 a follower; once the leader has compacted its log past the follower's index, restart
    the follower (it must install a snapshot) and kill it again ``install_kill_s`` after the
    snapshot transfer shows (its incoming file), i.e. in the middle of the install."""
    target = ctx.follower(int(step.params.get("k", 0)))
    before = ctx.cluster.view(target)
    applied = before.applied_index if before is not None else 0
    fid = ctx.fault("kill", [target], signal="SIGKILL", variant="snapshot",
                    install_kill_s=step.params["install_kill_s"])
    try:
        ctx.cluster.kill(target)
        leader = ctx.leader()
        mark = ctx.cluster.log_size(leader)
        deadline = time.monotonic() + SNAPSHOT_WAIT_S
        compacted = False
        while time.monotonic() < deadline and not ctx.abort.is_set() and not compacted:
            compacted = any(int(m) > applied for m in _SNAPSHOT_WRITTEN.findall(ctx.cluster.log_since(leader, mark)))
            if not compacted:
                time.sleep(0.2)
        ctx.note(fid, leader_compacted_past_follower=compacted)
        mark = ctx.cluster.log_size(target)
        ctx.cluster.spawn(target)
        receiving = _await_snapshot_transfer(ctx, target, mark)
        ctx.hold(float(step.params["install_kill_s"]))
        ctx.cluster.kill(target)
        installed = bool(_SNAPSHOT_RESTORED.search(ctx.cluster.log_since(target, mark)))
        ctx.note(fid, receiving_snapshot_seen=receiving, killed_after_s=step.params["install_kill_s"],
                 snapshot_restored_before_kill=installed)
        ctx.hold(float(step.params.get("down_s", 0.5)))
    finally:
        if not ctx.cluster.alive(target):
            ctx.cluster.spawn(target)
        ctx.heal(fid, "kill", restarted=[ctx.node(target)])


def _await_snapshot_transfer(ctx: Ctx, i: int, log_mark: int) -> bool:
    """Poll until node ``i`` receives a snapshot (pysyncobj's incoming file exists) or restored one;
    True when the transfer was seen in progress."""
    incoming = ctx.cluster.node_data_dir(i) / "raft" / f"{DUMP_FILE_NAME}.1.tmp"
    started = time.time() - 0.05  # a file left by an install killed earlier does not count
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while time.monotonic() < deadline and not ctx.abort.is_set() and ctx.cluster.alive(i):
        try:
            if incoming.stat().st_mtime >= started:
                return True
        except FileNotFoundError:
            pass
        if _SNAPSHOT_RESTORED.search(ctx.cluster.log_since(i, log_mark)):
            return False
        time.sleep(0.002)
    return False


def pause(ctx: Ctx, step: Step) -> None:
    """SIGSTOP the ``target`` for ``pause_s`` (longer than the election timeout), then SIGCONT."""
    target = ctx.leader() if step.params["target"] == "leader" else ctx.follower(int(step.params.get("k", 0)))
    fid: int | None = None
    try:
        ctx.cluster.pause(target)
        fid = ctx.fault("pause", [target], signal="SIGSTOP", pause_s=step.params["pause_s"])
        ctx.hold(float(step.params["pause_s"]))
    finally:
        ctx.cluster.resume(target)
        if fid is not None:
            ctx.heal(fid, "pause")


def rolling_restart(ctx: Ctx, step: Step) -> None:
    """Restart every node in the planned ``order`` (node indexes; ``leader`` is resolved at its turn),
    gracefully (SIGTERM) or not (SIGKILL), waiting for each to catch up before the next."""
    graceful = bool(step.params.get("graceful", True))
    done: set[int] = set()
    for slot in step.params["order"]:
        i = ctx.leader() if slot == "leader" else int(slot)
        if i in done:
            i = next(j for j in range(ctx.cluster.nodes) if j not in done)
        done.add(i)
        restart_node(ctx, i, graceful, float(step.params.get("gap_s", 0.5)))


def restart_node(ctx: Ctx, i: int, graceful: bool, gap_s: float, kind: str = "restart",
                 before_spawn: Callable[[], None] | None = None, **detail: object) -> None:
    """Stop node ``i`` (SIGTERM or SIGKILL), start it again (``before_spawn`` first: e.g. a new
    environment), wait until it has applied what was committed before it stopped and a leader is
    agreed on, then hold ``gap_s``. Recorded as a ``kind`` fault."""
    leader = ctx.cluster.current_leader()
    target_index = 0
    if leader is not None:
        lv = ctx.cluster.view(leader)
        target_index = lv.commit_index if lv is not None else 0
    fid = ctx.fault(kind, [i], signal="SIGTERM" if graceful else "SIGKILL", was_leader=i == leader, **detail)
    try:
        ctx.cluster.kill(i, signal.SIGTERM if graceful else signal.SIGKILL)
    finally:
        if before_spawn is not None:
            before_spawn()
        ctx.cluster.spawn(i)
        ctx.heal(fid, kind)
    if not ctx.cluster.wait_caught_up(i, target_index, RECOVERY_TIMEOUT_S):
        raise NemesisError(f"{ctx.node(i)} did not catch up to index {target_index} after its {kind}")
    if ctx.cluster.wait_leader(RECOVERY_TIMEOUT_S) is None:
        raise NemesisError(f"no leader after a {kind} step")
    ctx.hold(gap_s)
