"""The drill scenarios: which nemesis, with which seeded choices, and what each needs.

``plan(rng, duration_s)`` draws every choice of a run's schedule up front from the drill's RNG, so
the schedule printed at the start is the schedule that runs (targets named by role are resolved
when each fault starts). The runner executes steps until the duration is used up.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chaos.nemeses import Nemesis, Step
from chaos.nemeses.clock import CLOCK_ENV, clock_jump, clock_jump_step
from chaos.nemeses.compound import membership_under_fault
from chaos.nemeses.disk import MODES, corrupt
from chaos.nemeses.membership import membership
from chaos.nemeses.network import loss, partition
from chaos.nemeses.power import POWER_LOSS_ENV, power_loss
from chaos.nemeses.process import kill, pause, rolling_restart
from chaos.nemeses.upgrade import UPGRADE_ENV, rolling_upgrade

# Snapshots every few seconds under the drill's load, so installs and SST files happen in a run.
SNAPSHOT_OFTEN = {"RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES": "100"}
MAX_STEPS = 200

NEMESES: dict[str, Nemesis] = {"kill": kill, "pause": pause, "partition": partition, "loss": loss,
                               "corrupt": corrupt, "rolling-restart": rolling_restart,
                               "power-loss": power_loss, "membership": membership, "clock-jump": clock_jump,
                               "membership+fault": membership_under_fault, "upgrade": rolling_upgrade}


@dataclass(frozen=True)
class Scenario:
    """A named drill. ``unavailable`` states why it cannot run anywhere today (no cluster needed);
    ``probe`` asks the running cluster (its gRPC addresses) why it cannot run (``None``: it can)."""

    name: str
    summary: str
    step: Callable[[random.Random, int], Step] | None = None
    needs_link_faults: bool = False
    node_env: dict[str, str] = field(default_factory=dict)
    durability: str = "disk"  # of the workload's topic
    opening: Callable[[random.Random, int], Step] | None = None  # the first step, when it must be this one
    unavailable: str | None = None
    probe: Callable[[list[str]], str | None] | None = None

    def plan(self, rng: random.Random, duration_s: float, nodes: int) -> list[Step]:
        """Enough seeded steps to fill ``duration_s`` (the runner stops when time is up)."""
        assert self.step is not None
        steps: list[Step] = []
        budget = duration_s
        while budget > 0 and len(steps) < MAX_STEPS:
            s = self.opening(rng, nodes) if self.opening is not None and not steps else self.step(rng, nodes)
            steps.append(s)
            budget -= _estimate_s(s)
        return steps


def _estimate_s(step: Step) -> float:
    p: dict[str, Any] = step.params
    held = sum(float(p.get(k, 0.0)) for k in ("down_s", "pause_s", "hold_s", "install_kill_s", "side_hold_s"))
    if step.kind in ("rolling-restart", "upgrade"):
        held = 5.0 * len(p["order"])
    return held + float(p.get("quiet_s", 0.0)) + 1.0


def _quiet(rng: random.Random) -> float:
    return round(rng.uniform(1.0, 3.0), 2)


def _kill_leader(rng: random.Random, nodes: int) -> Step:
    return Step("kill", {"target": "leader", "variant": rng.choice(["plain", "plain", "election"]),
                         "k": rng.randrange(16), "election_kill_s": round(rng.uniform(0.1, 0.7), 2),
                         "down_s": round(rng.uniform(0.5, 3.0), 2), "quiet_s": _quiet(rng)})


def _kill_follower(rng: random.Random, nodes: int) -> Step:
    variant = rng.choice(["plain", "snapshot"])
    return Step("kill", {"target": "follower", "variant": variant, "k": rng.randrange(16),
                         "down_s": round(rng.uniform(0.5, 3.0), 2),
                         "install_kill_s": round(rng.uniform(0.0, 0.2), 3), "quiet_s": _quiet(rng)})


def _pause_leader(rng: random.Random, nodes: int) -> Step:
    return Step("pause", {"target": "leader", "pause_s": round(rng.uniform(1.2, 4.0), 2), "quiet_s": _quiet(rng)})


def _partition_leader(rng: random.Random, nodes: int) -> Step:
    return Step("partition", {"shape": "isolate-leader", "hold_s": round(rng.uniform(2.0, 6.0), 2),
                              "quiet_s": _quiet(rng)})


def _partition_minority(rng: random.Random, nodes: int) -> Step:
    return Step("partition", {"shape": rng.choice(["isolate-follower", "split", "bridge"]), "k": rng.randrange(16),
                              "with_leader": rng.random() < 0.5, "bridge_is_leader": rng.random() < 0.5,
                              "hold_s": round(rng.uniform(2.0, 6.0), 2), "quiet_s": _quiet(rng)})


def _packet_loss(rng: random.Random, nodes: int) -> Step:
    return Step("loss", {"probability": round(rng.uniform(0.05, 0.35), 3), "hold_s": round(rng.uniform(3.0, 8.0), 2),
                         "quiet_s": _quiet(rng)})


def _corrupt(rng: random.Random, nodes: int) -> Step:
    return Step("corrupt", {"mode": rng.choice(MODES), "target": rng.choice(["follower", "follower", "leader"]),
                            "k": rng.randrange(16), "salt": rng.getrandbits(32), "flips": rng.randint(1, 8),
                            "down_s": round(rng.uniform(0.2, 1.0), 2), "quiet_s": _quiet(rng)})


def _power_loss(rng: random.Random, nodes: int, targets: str | None = None) -> Step:
    return Step("power-loss", {"targets": targets or rng.choice(["all", "majority", "majority", "leader", "follower"]),
                               "k": rng.randrange(16), "stagger_s": round(rng.uniform(0.0, 0.05), 3),
                               "down_s": round(rng.uniform(0.3, 2.0), 2), "quiet_s": _quiet(rng)})


def _whole_cluster_power_loss(rng: random.Random, nodes: int) -> Step:
    return _power_loss(rng, nodes, "all")


def _rolling_restart(rng: random.Random, nodes: int) -> Step:
    order: list[Any] = list(range(nodes))
    rng.shuffle(order)
    order[rng.randrange(nodes)] = "leader"  # one turn goes to whoever leads then
    return Step("rolling-restart", {"order": order, "graceful": rng.random() < 0.75,
                                    "gap_s": round(rng.uniform(0.3, 1.5), 2), "quiet_s": _quiet(rng)})


def _rolling_upgrade(rng: random.Random, nodes: int) -> Step:
    step = _rolling_restart(rng, nodes)
    return Step("upgrade", step.params)


def _membership(rng: random.Random, nodes: int) -> Step:
    return Step("membership", {"target": rng.choice(["leader", "follower"]), "k": rng.randrange(16),
                               "hold_s": round(rng.uniform(1.0, 4.0), 2), "quiet_s": _quiet(rng)})


def _membership_under_fault(rng: random.Random, nodes: int) -> Step:
    """A membership change with a second fault while it is in flight (``chaos.nemeses.compound``):
    the leader partitioned away, or the follower being removed paused."""
    side = rng.choice(["partition", "pause-target"])
    target = "follower" if side == "pause-target" else rng.choice(["leader", "follower"])
    return Step("membership+fault", {
        "target": target, "k": rng.randrange(16), "hold_s": round(rng.uniform(1.0, 3.0), 2), "side": side,
        "side_delay_s": round(rng.uniform(0.0, 0.5), 2), "side_hold_s": round(rng.uniform(1.0, 3.0), 2),
        "quiet_s": _quiet(rng)})


# Every kind of fault, drawn anew for each step of a ``mixed`` run (the two compound steps twice as
# often: they are the rarest schedules anywhere else).
_MIXED: list[Callable[[random.Random, int], Step]] = [
    _kill_leader, _kill_follower, _pause_leader, _partition_leader, _partition_minority, _packet_loss, _corrupt,
    _power_loss, _rolling_restart, _membership, clock_jump_step, _membership_under_fault, _membership_under_fault]


def _mixed(rng: random.Random, nodes: int) -> Step:
    return rng.choice(_MIXED)(rng, nodes)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in [
    Scenario("kill-leader", "kill -9 the leader (sometimes a second node mid-election), restart it", _kill_leader),
    Scenario("kill-follower", "kill -9 a follower (sometimes again during its snapshot install)", _kill_follower,
             node_env=SNAPSHOT_OFTEN),
    Scenario("pause-leader", "SIGSTOP the leader longer than the election timeout, then SIGCONT", _pause_leader),
    Scenario("partition-leader", "cut the leader off from every other node (clients still reach it)",
             _partition_leader, needs_link_faults=True),
    Scenario("partition-minority", "isolate a follower, split a minority off, or bridge two halves through "
             "one node", _partition_minority, needs_link_faults=True),
    Scenario("packet-loss", "lose 5-35% of the packets between nodes for seconds", _packet_loss,
             needs_link_faults=True),
    Scenario("power-loss", "cut the power of every node, a majority or one (unsynced writes are lost) while "
             "writing to an fsync topic, power them on", _power_loss,
             node_env={**POWER_LOSS_ENV, **SNAPSHOT_OFTEN}, durability="fsync", opening=_whole_cluster_power_loss),
    Scenario("corrupt", "flip bytes in or truncate one stopped node's store files, restart it, repair what "
             "it detects", _corrupt, node_env=SNAPSHOT_OFTEN),
    Scenario("membership", "remove a node (leader or follower), wipe it, keep it out while the others serve, "
             "add it back empty: it catches up by snapshot", _membership, node_env=SNAPSHOT_OFTEN),
    Scenario("rolling-restart", "restart every node in turn (mostly SIGTERM), waiting for each to catch up",
             _rolling_restart),
    Scenario("rolling-upgrade", "start every node as the previous release (one command format lower), "
             "restart them in turn onto this one while writing; then rolling restarts. The cluster's format "
             "must rise only after the last", _rolling_restart, node_env=UPGRADE_ENV, opening=_rolling_upgrade),
    Scenario("clock-jump", "jump the node clock of the leader, a follower or every node by 1 s to 10 min, "
             "either way, for seconds (sometimes then kill the jumped leader), set it back", clock_jump_step,
             node_env=CLOCK_ENV),
    Scenario("mixed", "every kind of fault above in one run, drawn per step, plus a membership change with the "
             "leader partitioned or the removed follower paused meanwhile (fsync topic, power-loss restarts, "
             "snapshots often, node clocks)", _mixed, needs_link_faults=True,
             node_env={**SNAPSHOT_OFTEN, **POWER_LOSS_ENV, **CLOCK_ENV}, durability="fsync"),
]}

ALL = "all"
