"""Nemeses: faults a drill injects and heals, each recorded in the history (``fault`` / ``heal``).

A nemesis is a function ``(ctx, step) -> None`` that injects one fault, holds it for the step's
seeded duration, and heals it — in a ``finally``, so an aborted drill heals too (the drill runner
heals everything once more at the end: resumes paused nodes, heals the network, restarts dead
nodes). Targets are named by role (``leader``, ``follower``) and resolved when the fault starts;
every other choice (which follower, how long, which bytes) comes from the step's parameters,
drawn from the drill's one seeded RNG when the schedule was planned.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.cluster import ChaosCluster
from chaos.history import History

RECOVERY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Step:
    """One planned fault: ``kind`` names the nemesis; ``params`` are its seeded choices."""

    kind: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.kind}(" + ", ".join(f"{k}={_fmt(v)}" for k, v in self.params.items()) + ")"


def _fmt(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


@dataclass
class Ctx:
    """What a nemesis acts on and records into."""

    cluster: ChaosCluster
    history: History
    abort: threading.Event
    topics: dict[str, int] = field(default_factory=dict)  # the workload's topics and partition counts
    echo: Callable[[str], None] = print
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def node(self, i: int) -> str:
        return self.cluster.node_id(i)

    def fault(self, kind: str, targets: list[int], **detail: Any) -> int:
        fid = next(self.ids)
        names = [self.node(i) for i in targets]
        self.history.info("nemesis", "fault", {"id": fid, "kind": kind, "targets": names, **detail})
        self.echo(f"  [{self.history.now():6.1f}s] fault {fid}: {kind} {','.join(names)} "
                  + " ".join(f"{k}={_fmt(v)}" for k, v in detail.items()))
        return fid

    def note(self, fid: int, **detail: Any) -> None:
        """Record what a fault observed while it was active (e.g. the roles at a kill)."""
        self.history.info("nemesis", "fault-note", {"id": fid, **detail})
        self.echo(f"  [{self.history.now():6.1f}s]   fault {fid}: " + " ".join(f"{k}={v}" for k, v in detail.items()))

    def heal(self, fid: int, kind: str, **detail: Any) -> None:
        self.history.info("nemesis", "heal", {"id": fid, "kind": kind, **detail})
        self.echo(f"  [{self.history.now():6.1f}s] heal {fid}: {kind}")

    def hold(self, seconds: float) -> None:
        """Keep a fault in place for ``seconds`` (returns early when the drill is aborted)."""
        self.abort.wait(seconds)

    def leader(self) -> int:
        """The current leader, waiting for one if there is none right now."""
        leader = self.cluster.current_leader()
        if leader is None:
            leader = self.cluster.wait_leader(RECOVERY_TIMEOUT_S)
        if leader is None:
            raise NemesisError("no leader to target")
        return leader

    def follower(self, k: int) -> int:
        """The ``k``-th (mod count) running follower, in node order."""
        leader = self.leader()
        followers = [i for i in range(self.cluster.nodes) if i != leader and self.cluster.alive(i)]
        if not followers:
            raise NemesisError("no follower to target")
        return followers[k % len(followers)]

    def restart_dead(self) -> list[int]:
        dead = [i for i in range(self.cluster.nodes) if not self.cluster.alive(i)]
        for i in dead:
            self.cluster.spawn(i)
        return dead


class NemesisError(RuntimeError):
    """A fault could not be injected as planned (recorded; the drill goes on)."""


Nemesis = Callable[[Ctx, Step], None]
