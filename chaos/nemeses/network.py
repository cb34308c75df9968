"""Network faults between nodes (never between the drill's clients and the nodes): isolating the
leader, a majority/minority split, a bridge (two halves that only one node connects), and packet
loss. They need a fabric with link faults (``netns``, or the ``proxy`` fallback)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.nemeses import Ctx, NemesisError, Step


def partition(ctx: Ctx, step: Step) -> None:
    """Shapes: ``isolate-leader`` (leader alone; clients still reach it), ``isolate-follower``,
    ``split`` (a seeded minority, rest), ``bridge`` (halves A and C, node B linked to both)."""
    shape = str(step.params["shape"])
    n = ctx.cluster.nodes
    leader = ctx.leader()
    others = [i for i in range(n) if i != leader]
    order = [others[(int(step.params.get("k", 0)) + j) % len(others)] for j in range(len(others))]
    if shape == "isolate-leader":
        groups, targets = [[leader], others], [leader]
    elif shape == "isolate-follower":
        groups, targets = [[order[0]], [i for i in range(n) if i != order[0]]], [order[0]]
    elif shape == "split":
        minority = sorted(([leader] if step.params.get("with_leader") else []) + order)[: (n - 1) // 2]
        groups, targets = [minority, [i for i in range(n) if i not in minority]], minority
    elif shape == "bridge":
        bridge = leader if step.params.get("bridge_is_leader") else order[0]
        rest = [i for i in range(n) if i != bridge]
        half = len(rest) // 2
        a, c = rest[:half], rest[half:]
        _inject_hold_heal(ctx, [bridge], {"shape": "bridge", "sides": f"{names(ctx, a)}|{names(ctx, c)}"},
                          float(step.params["hold_s"]), lambda: ctx.cluster.fabric.cut([(x, y) for x in a for y in c]))
        return
    else:
        raise NemesisError(f"unknown partition shape {shape!r}")
    _inject_hold_heal(ctx, targets, {"shape": shape, "sides": "|".join(names(ctx, g) for g in groups)},
                      float(step.params["hold_s"]), lambda: ctx.cluster.fabric.partition(groups))


def names(ctx: Ctx, nodes: list[int]) -> str:
    return ",".join(ctx.node(i) for i in nodes)


def _inject_hold_heal(ctx: Ctx, targets: list[int], detail: dict[str, Any], hold_s: float,
                      inject: Callable[[], None], kind: str = "partition") -> None:
    """The fault is recorded once it is in effect (all rules installed), and always healed."""
    fid: int | None = None
    try:
        inject()
        fid = ctx.fault(kind, targets, **detail, hold_s=hold_s)
        ctx.hold(hold_s)
    finally:
        ctx.cluster.fabric.heal()
        if fid is not None:
            ctx.heal(fid, kind)


def loss(ctx: Ctx, step: Step) -> None:
    """Lose ``probability`` of the packets between all nodes for ``hold_s``."""
    nodes = list(range(ctx.cluster.nodes))
    probability = float(step.params["probability"])
    _inject_hold_heal(ctx, nodes, {"probability": probability, "fabric": ctx.cluster.fabric.name},
                      float(step.params["hold_s"]), lambda: ctx.cluster.fabric.loss(probability, nodes), "packet-loss")
