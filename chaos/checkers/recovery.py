"""Faults and recovery, from the history: when each fault was injected and healed, how long after
each fault the first publish invoked since then was acknowledged, and how long after the last
fault healed (the recovery time). A cluster that acknowledges nothing invoked after the last heal
has not recovered: that is a violation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaos.checkers.model import Model, Violation, violation


@dataclass
class Recovery:
    """Timings in seconds since the start of the run (``None``: did not happen)."""

    faults: list[dict[str, Any]] = field(default_factory=list)
    last_heal_s: float | None = None
    recovery_s: float | None = None  # last heal -> first acknowledged publish invoked after it
    # -> every node applied the same index, from the last heal (the drill lets the workload run
    # TAIL_AFTER_HEAL_S past its first ack, so that is in it) and from the moment the writes stopped
    converged_s: float | None = None
    converged_after_stop_s: float | None = None
    max_unavailable_s: float = 0.0  # longest stretch without any acknowledged publish

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)
        return {"faults": self.faults, "last_heal_s": r(self.last_heal_s), "recovery_s": r(self.recovery_s),
                "converged_s": r(self.converged_s), "converged_after_stop_s": r(self.converged_after_stop_s),
                "max_unavailable_s": r(self.max_unavailable_s)}


def _first_ok_after(oks: list[tuple[float, float]], t: float) -> float | None:
    done = [end for start, end in oks if start >= t]
    return min(done) - t if done else None


def measure(model: Model) -> tuple[Recovery, list[Violation]]:
    oks = sorted((inv.time, done.time) for inv, done in model.publish_ops if done is not None and done.type == "ok")
    rec = Recovery()
    faults: dict[Any, dict[str, Any]] = {}
    for e in model.entries:
        if e.type != "info":
            continue
        if e.f == "fault":
            faults[e.value["id"]] = {**e.value, "at_s": round(e.time, 3), "healed_s": None}
        elif e.f == "heal" and e.value.get("id") in faults:
            faults[e.value["id"]]["healed_s"] = round(e.time, 3)
            rec.last_heal_s = e.time if rec.last_heal_s is None else max(rec.last_heal_s, e.time)
        elif e.f == "converged" and e.value.get("after_heal_s") is not None:
            rec.converged_s = float(e.value["after_heal_s"])
            stopped = e.value.get("after_writes_stopped_s")  # absent in older histories
            rec.converged_after_stop_s = None if stopped is None else float(stopped)
    for f in faults.values():
        first = _first_ok_after(oks, f["at_s"])
        f["first_ack_after_fault_s"] = None if first is None else round(first, 3)
    rec.faults = list(faults.values())
    first_invoke = min((inv.time for inv, _ in model.publish_ops), default=None)
    ends = sorted(end for _, end in oks)
    if first_invoke is not None and ends:
        ends.insert(0, first_invoke)  # the wait for the very first acknowledgement counts too
    rec.max_unavailable_s = max((b - a for a, b in zip(ends, ends[1:], strict=False)), default=0.0)
    out: list[Violation] = []
    if rec.last_heal_s is not None:
        rec.recovery_s = _first_ok_after(oks, rec.last_heal_s)
        if rec.recovery_s is None:
            after = [inv.index for inv, _ in model.publish_ops if inv.time >= rec.last_heal_s]
            out.append(violation("no-recovery", "no publish invoked after the last fault healed "
                                 f"(at {rec.last_heal_s:.2f} s) was acknowledged ({len(after)} tried)",
                                 [], after))
    unhealed = [f for f in rec.faults if f["healed_s"] is None]
    if unhealed:
        out.append(violation("fault-not-healed", f"{len(unhealed)} fault(s) were never healed",
                             [f"{f['id']}:{f['kind']}" for f in unhealed]))
    return rec, out
