"""A rolling upgrade across a command format (docs/design/command-formats.md).

The nodes start as the previous release: one command format lower, through the test-only
``RAFTBROKER_TEST_APPLY_FORMAT`` (a node of this code that applies only the older formats). The
step restarts them one by one onto this code, in a seeded order (one turn goes to whoever leads
then), mostly gracefully, waiting for each to catch up, while the workload writes. The leader
checks the members' formats every housekeeping period (:data:`UPGRADE_ENV` makes that 200 ms, so
a check lands inside nearly every turn).

Before each turn and after the last, the nemesis records every answering node's formats in the
history (``formats``); ``chaos.checkers.formats`` then proves the rule: the cluster's format never
rises while a member runs the older release, and it does rise once the last member is upgraded.
Replica divergence, had an old node applied a newer command differently, is the replicas
checker's to find; a node that halted before one would fail the drill's convergence.
"""

from __future__ import annotations

import functools
import time

from broker.core import formats
from chaos.nemeses import Ctx, Step
from chaos.nemeses.process import restart_node

OLDER = str(formats.CODE_FORMAT - 1)
UPGRADE_ENV = {formats.APPLY_FORMAT_ENV: OLDER, "RAFTBROKER_HOUSEKEEPING_PERIOD_MS": "200"}
UPGRADED = {formats.APPLY_FORMAT_ENV: ""}  # this code's formats (an empty setting is no setting)
RAISE_WAIT_S = 30.0


def record_formats(ctx: Ctx, moment: str) -> dict[str, dict[str, int]]:
    """Record (and return) every answering node's formats: node -> {"apply", "cluster"}."""
    seen: dict[str, dict[str, int]] = {}
    for i in range(ctx.cluster.nodes):
        info = ctx.cluster.node_status(i) if ctx.cluster.alive(i) and i not in ctx.cluster.paused else None
        if info is not None:
            seen[ctx.node(i)] = {"apply": info.apply_format, "cluster": info.cluster_format}
    ctx.history.info("nemesis", "formats", {"moment": moment, "code_format": formats.CODE_FORMAT, "nodes": seen})
    return seen


def rolling_upgrade(ctx: Ctx, step: Step) -> None:
    """Restart every node not yet upgraded onto this code's formats, in the planned ``order``."""
    graceful = bool(step.params.get("graceful", True))
    done = {i for i in range(ctx.cluster.nodes) if ctx.cluster.env_by_node.get(i) == UPGRADED}
    for slot in step.params["order"]:
        i = ctx.leader() if slot == "leader" else int(slot)
        if i in done:
            rest = [j for j in range(ctx.cluster.nodes) if j not in done]
            if not rest:
                break
            i = rest[0]
        record_formats(ctx, f"before upgrading {ctx.node(i)}")
        done.add(i)
        restart_node(ctx, i, graceful, float(step.params.get("gap_s", 0.5)), "upgrade",
                     functools.partial(ctx.cluster.env_by_node.__setitem__, i, dict(UPGRADED)),
                     to_format=formats.CODE_FORMAT)
    deadline = time.monotonic() + RAISE_WAIT_S
    while not ctx.abort.is_set():
        seen = record_formats(ctx, "after the last upgrade")
        if len(seen) == ctx.cluster.nodes and all(f["cluster"] == formats.CODE_FORMAT for f in seen.values()):
            return
        if time.monotonic() > deadline:
            return  # the checker reports it (format-not-raised)
        ctx.hold(0.5)
