"""Two faults at once: a membership change with a second fault injected while it is in flight.

Raft's configuration changes are where implementations break most (the removed node still votes,
the new configuration commits without the old majority, a snapshot is installed into a node that
is being added). The second fault starts ``side_delay_s`` after the membership step began (seeded,
within the removal) and is held for ``side_hold_s``:
- ``partition``: the leader is cut off from every other node (it may be the node being removed);
- ``pause-target``: the node being removed is SIGSTOPped (a member that goes silent while the
  leader commits the configuration without it; it is then killed and wiped like any removed node).
Both are healed in a ``finally``; the membership step itself re-adds the node whatever happens.
"""

from __future__ import annotations

import threading
from dataclasses import replace

from chaos.nemeses import Ctx, NemesisError, Step
from chaos.nemeses.membership import membership, resolve_target
from chaos.nemeses.network import names

SIDES = ("partition", "pause-target")


def membership_under_fault(ctx: Ctx, step: Step) -> None:
    """Run the ``membership`` step with the ``side`` fault of its parameters injected meanwhile."""
    side = str(step.params["side"])
    if side not in SIDES:
        raise NemesisError(f"unknown side fault {side!r}")
    target = resolve_target(ctx, step)
    errors: list[BaseException] = []
    thread = threading.Thread(target=_side_fault, args=(ctx, step, side, target, errors), name="side-fault",
                              daemon=True)
    thread.start()
    try:
        membership(ctx, replace(step, params={**step.params, "index": target}))
    finally:
        thread.join()
    if errors:
        raise NemesisError(f"side fault {side} could not run: {errors[0]}")


def _side_fault(ctx: Ctx, step: Step, side: str, target: int, errors: list[BaseException]) -> None:
    try:
        ctx.hold(float(step.params["side_delay_s"]))
        if ctx.abort.is_set():
            return
        if side == "pause-target":
            _pause(ctx, target, float(step.params["side_hold_s"]))
        else:
            _isolate_leader(ctx, float(step.params["side_hold_s"]))
    except Exception as err:  # recorded by the caller as a nemesis error; the drill goes on
        errors.append(err)


def _pause(ctx: Ctx, target: int, hold_s: float) -> None:
    if not ctx.cluster.alive(target):
        return  # already stopped and wiped by the membership step: nothing left to pause
    fid: int | None = None
    try:
        ctx.cluster.pause(target)
        fid = ctx.fault("pause", [target], signal="SIGSTOP", during="membership change", pause_s=hold_s)
        ctx.hold(hold_s)
    finally:
        ctx.cluster.resume(target)
        if fid is not None:
            ctx.heal(fid, "pause")


def _isolate_leader(ctx: Ctx, hold_s: float) -> None:
    leader = ctx.cluster.current_leader()
    if leader is None:
        return  # mid-election: the membership step is already under a fault of its own making
    others = [i for i in range(ctx.cluster.nodes) if i != leader]
    fid: int | None = None
    try:
        ctx.cluster.fabric.partition([[leader], others])
        fid = ctx.fault("partition", [leader], shape="isolate-leader", during="membership change",
                        sides=f"{names(ctx, [leader])}|{names(ctx, others)}", hold_s=hold_s)
        ctx.hold(hold_s)
    finally:
        ctx.cluster.fabric.heal()
        if fid is not None:
            ctx.heal(fid, "partition")
