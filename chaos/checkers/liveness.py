"""Liveness (SPEC §9 says what must never happen; these say what must happen, and by when).

Safety checks pass on a cluster that does nothing; these fail it. Every bound is generous enough
for a loaded 2-core machine (CI shares it) and stated in ``docs/drills.md``:
- ``slow-recovery``: after the last fault healed, a publish invoked after the heal is acknowledged
  within :data:`RECOVERY_BOUND_S` (``no-recovery`` covers "never");
- ``no-leader``: after the last heal, some node reports itself leader within :data:`LEADER_BOUND_S`;
- ``lease-not-redelivered``: a record leased to a queue-group member and not settled (by any
  member's ack) within the visibility timeout is delivered again (or settled by a late ack of its
  old holder, which the broker accepts while nobody else holds it) within visibility + :data:`LEASE_BOUND_S`, the wait
  extended by the time faults overlap it (each fault from injection until the cluster serves again:
  at least :data:`FAULT_SETTLE_S` after its heal, and until the first publish acknowledged after
  it; a failover drops the leases, and the new leader redelivers them). A lease whose
  deadline falls after the group's last delivery (the run ended) is not judged; the report counts
  the leases judged and not judged;
- ``group-stalled``: a group did not settle the topic to its end within the drain bound after the
  final reads (``group-not-drained``), i.e. it stopped making progress.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from chaos.checkers.model import Model, Violation, violation
from chaos.history import Entry, pairs

RECOVERY_BOUND_S = 15.0
LEADER_BOUND_S = 15.0
LEASE_BOUND_S = 10.0
FAULT_SETTLE_S = 5.0


@dataclass(frozen=True)
class LivenessFigures:
    """What the liveness checks looked at (for the report)."""

    leader_after_heal_s: float | None
    leases_judged: int
    leases_not_judged: int


def check_liveness(model: Model, last_heal_s: float | None,
                   recovery_s: float | None) -> tuple[list[Violation], LivenessFigures]:
    out: list[Violation] = []
    if last_heal_s is not None and recovery_s is not None and recovery_s > RECOVERY_BOUND_S:
        out.append(violation("slow-recovery", f"the first publish invoked after the last heal was acknowledged "
                             f"{recovery_s:.2f} s after it (bound {RECOVERY_BOUND_S:g} s)", []))
    leader_s = _leader_after(model, last_heal_s)
    polled = any(e.type == "info" and e.f == "status" for e in model.entries)
    if last_heal_s is not None and polled and (leader_s is None or leader_s > LEADER_BOUND_S):
        seen = "none" if leader_s is None else f"{leader_s:.2f} s"
        out.append(violation("no-leader", f"no node reported itself leader within {LEADER_BOUND_S:g} s of the last "
                             f"heal (first: {seen})", []))
    lease_violations, judged, skipped = _leases(model)
    out += lease_violations
    out += [violation("group-stalled", f"group {e.value.get('group')} of {e.value.get('topic')} did not settle the "
                      "topic to its end within the drain bound", [f"{e.value.get('group')}: committed "
                                                                  f"{e.value.get('committed')}, ends "
                                                                  f"{e.value.get('ends')}"], [e.index])
            for e in model.entries if e.type == "info" and e.f == "group-not-drained"]
    return out, LivenessFigures(leader_s, judged, skipped)


def _leader_after(model: Model, t: float | None) -> float | None:
    """Seconds from ``t`` until some node is known to lead: its latest status says leader, in the
    highest term any node has reported (status entries are written on change only, so the state at
    ``t`` is replayed from the start). ``None`` when that never happens."""
    if t is None:
        return None
    latest: dict[str, tuple[str, int]] = {}
    reached_t = False
    for e in model.entries:
        if e.type != "info" or e.f != "status":
            continue
        if e.time >= t and not reached_t:
            reached_t = True
            if _leads(latest):
                return 0.0
        latest[str(e.value["node"])] = (str(e.value.get("role")), int(e.value.get("term", 0)))
        if e.time >= t and _leads(latest):
            return e.time - t
    return 0.0 if not reached_t and _leads(latest) else None


def _leads(latest: dict[str, tuple[str, int]]) -> bool:
    top = max((term for _, term in latest.values()), default=None)
    return top is not None and any(role == "leader" and term == top for role, term in latest.values())


def fault_windows(model: Model) -> list[tuple[float, float]]:
    """[injected, served again] of every fault: served again is the later of its heal +
    :data:`FAULT_SETTLE_S` and the first publish acknowledged after the heal (to the end of the run
    when never healed or never acknowledged after). Nodes restarted after a power loss can take
    longer than the settle time on a loaded machine, and no lease is redelivered before the cluster
    serves again; ``slow-recovery`` judges that time on its own."""
    end = model.entries[-1].time if model.entries else 0.0
    acks = [e.time for e in model.entries if e.type == "ok" and e.f == "publish"]  # in time order
    at: dict[object, float] = {}
    windows = []
    for e in model.entries:
        if e.type != "info":
            continue
        if e.f == "fault":
            at[e.value.get("id")] = e.time
        elif e.f == "heal" and e.value.get("id") in at:
            served = next((t for t in acks if t >= e.time), end)
            windows.append((at.pop(e.value.get("id")), max(e.time + FAULT_SETTLE_S, served)))
    windows += [(t, end) for t in at.values()]
    return windows


def _leases(model: Model) -> tuple[list[Violation], int, int]:
    """Queue-group leases not settled in time must be delivered again in time (module doc)."""
    visibility = {(str(e.value["topic"]), str(e.value["group"])): int(e.value["visibility_timeout_ms"]) / 1000
                  for e in model.entries if e.type == "info" and e.f == "group-config"
                  and e.value.get("mode") == "queue"}
    if not visibility:
        return [], 0, 0
    windows = fault_windows(model)
    deliveries: dict[tuple[str, str, int, int], list[Entry]] = defaultdict(list)
    last_delivery: dict[tuple[str, str], float] = {}
    for e in model.entries:
        if e.type == "info" and e.f == "deliver":
            gkey = (str(e.value["topic"]), str(e.value["group"]))
            if gkey in visibility:
                deliveries[(*gkey, int(e.value["partition"]), int(e.value["offset"]))].append(e)
                last_delivery[gkey] = e.time
    settles = _settle_times(model)
    bad: list[str] = []
    entries: list[int] = []
    judged = skipped = 0
    for (topic, group, p, o), seen in deliveries.items():
        vis = visibility[(topic, group)]
        settled = settles.get((topic, group, p, o), [])
        for k, d in enumerate(seen):
            if any(t <= d.time + vis for t in settled):
                continue  # settled already (a duplicate delivery) or acked in time: no lease expired
            deadline = _deadline(d.time, vis + LEASE_BOUND_S, windows)
            if deadline > last_delivery[(topic, group)]:
                skipped += 1  # the run ended first
                continue
            judged += 1
            again = seen[k + 1].time if k + 1 < len(seen) else None
            late_ack = settled[0] if settled else None  # an old holder's late ack settles it too
            resolved = min((t for t in (again, late_ack) if t is not None), default=None)
            if resolved is None or resolved > deadline:
                late = "never" if again is None else f"after {again - d.time:.2f} s"
                bad.append(f"{group}/{p}:{o} leased to {d.value.get('member', '')} at {d.time:.2f} s, delivered "
                           f"again {late}" + ("" if late_ack is None else f", acked after {late_ack - d.time:.2f} s"))
                entries.append(d.index)
    out = [violation("lease-not-redelivered", f"{len(bad)} expired lease(s) not delivered again within the visibility "
                     f"timeout + {LEASE_BOUND_S:g} s", bad, entries)] if bad else []
    return out, judged, skipped


def _deadline(start: float, bound_s: float, windows: list[tuple[float, float]]) -> float:
    """``start + bound_s``, extended by the time faults (and their settling) overlap the wait."""
    deadline = start + bound_s
    for _ in range(len(windows) + 1):
        extra = sum(max(0.0, min(b, deadline) - max(a, start)) for a, b in windows)
        if start + bound_s + extra <= deadline:
            break
        deadline = start + bound_s + extra
    return deadline


def _settle_times(model: Model) -> dict[tuple[str, str, int, int], list[float]]:
    """(topic, group, partition, offset) -> when an ``ack`` naming the record settled it: its
    completion when acknowledged, its invoke when its outcome is unknown (it may have settled it);
    sorted. A definitely refused ack settles nothing; a nack asks for a redelivery."""
    out: dict[tuple[str, str, int, int], list[float]] = defaultdict(list)
    for inv, done in pairs(model.entries, "ack"):
        if done is not None and done.type == "fail":
            continue
        at = done.time if done is not None and done.type == "ok" else inv.time
        for p, o in inv.value.get("records", []):
            out[(str(inv.value.get("topic")), str(inv.value.get("group")), int(p), int(o))].append(at)
    return {k: sorted(v) for k, v in out.items()}
