"""Power loss: crash nodes so that everything they wrote but had not fsynced is gone.

The cluster runs with ``RAFTBROKER_SIMULATE_POWER_LOSS=1`` (see ``broker/replication/journal.py``):
every start of a node cuts its Raft journal back to the last fsync and rebuilds its store from the
snapshot and the synced journal, exactly what a node finds after its machine lost power. A fault
here is therefore a kill -9 (SIGKILL) of the chosen nodes, a few milliseconds apart as when a rack
loses power, held down for a while, then a restart of each. The drill's topic is an ``fsync``
topic, which must keep every acknowledged record through the loss of power on any number of nodes.
"""

from __future__ import annotations

import re
import time

from chaos.nemeses import RECOVERY_TIMEOUT_S, Ctx, NemesisError, Step

POWER_LOSS_ENV = {"RAFTBROKER_SIMULATE_POWER_LOSS": "1"}
_CUT = re.compile(rb"power-loss simulation: .* \(dropped (\d+) bytes\)")


def _targets(ctx: Ctx, which: str, k: int) -> list[int]:
    """The nodes that lose power: ``all``, a ``majority`` (the leader among them), ``leader`` or ``follower``."""
    leader = ctx.leader()
    everyone = list(range(ctx.cluster.nodes))
    if which == "all":
        return everyone
    if which == "leader":
        return [leader]
    if which == "follower":
        return [ctx.follower(k)]
    if which == "majority":
        others = [i for i in everyone if i != leader]
        need = ctx.cluster.nodes // 2 + 1
        return [leader] + [others[(k + j) % len(others)] for j in range(need - 1)]
    raise NemesisError(f"unknown power-loss target {which!r}")



def _await_answer(ctx: Ctx, victims: list[int]) -> None:
    """Poll until every restarted node answers its status (its journal was opened by then)."""
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline and not ctx.abort.is_set():
        if all(ctx.cluster.view(i) is not None for i in victims):
            return
        time.sleep(0.05)


def power_loss(ctx: Ctx, step: Step) -> None:
    """Cut the power of ``targets`` (``stagger_s`` apart), keep them down ``down_s``, power them on."""
    victims = _targets(ctx, str(step.params["targets"]), int(step.params.get("k", 0)))
    marks = {i: ctx.cluster.log_size(i) for i in victims}
    fid = ctx.fault("power-loss", victims, signal="SIGKILL", unsynced_writes="dropped at restart",
                    down_s=step.params["down_s"])
    try:
        for n, i in enumerate(victims):
            if n:
                ctx.hold(float(step.params.get("stagger_s", 0.0)))
            ctx.cluster.kill(i)
        ctx.hold(float(step.params["down_s"]))
    finally:
        for i in victims:
            if not ctx.cluster.alive(i):
                ctx.cluster.spawn(i)
        ctx.heal(fid, "power-loss", restarted=[ctx.node(i) for i in victims])
    _await_answer(ctx, victims)
    cuts = [int(n) for i in victims for n in _CUT.findall(ctx.cluster.log_since(i, marks[i]))]
    ctx.note(fid, journals_reopened=len(cuts), unsynced_bytes_dropped=sum(cuts))
    if len(cuts) != len(victims):
        raise NemesisError(f"{len(victims) - len(cuts)} restarted node(s) did not reopen their journal as after a "
                           "power loss (is RAFTBROKER_SIMULATE_POWER_LOSS set?)")
    if ctx.cluster.wait_leader(RECOVERY_TIMEOUT_S) is None:
        raise NemesisError("no leader after the nodes were powered on again")
