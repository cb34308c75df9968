"""Consumer-group checks (SPEC §3.2, §9): a group's committed position per partition never goes
back, once a group's workload drained a topic, every record of the log was delivered to the
group at least once, and a record delivered again is delivered again in time.

Committed positions come from ``commit`` acknowledgements and ``committed`` polls: any
observation made after an earlier one completed must not be lower (per topic, group, partition).

``redelivery-late``: two consecutive deliveries of one record to one group more than
:data:`REDELIVERY_GAP_MAX_S` apart. A record is delivered again after its lease ran out (the
group's visibility timeout, seconds), after a nack's delay (under a second in the workload) or at
once after a failover; leases and retry delays must not grow by the size of a clock jump (a leader
clock that went back, or a forward jump that was healed: up to ten minutes in the clock drill).
"""

from __future__ import annotations

from collections import defaultdict

from chaos.checkers.log import reference_reads
from chaos.checkers.model import Model, Violation, violation
from chaos.history import pairs

REDELIVERY_GAP_MAX_S = 60.0  # far above lease + failover recovery, far below the largest clock jump


def check_groups(model: Model) -> list[Violation]:
    return _regressions(model) + _undelivered(model) + _late_redeliveries(model)


def _observations(model: Model) -> list[tuple[float, float, tuple[str, str, int], int, int]]:
    """(start, end, (topic, group, partition), offset, entry) of every committed-position fact."""
    obs = []
    for inv, done in pairs(model.entries, "commit"):
        if done is not None and done.type == "ok":
            key = (str(inv.value["topic"]), str(inv.value["group"]), int(inv.value["partition"]))
            obs.append((inv.time, done.time, key, int(inv.value["offset"]), done.index))
    for e in model.entries:
        if e.type == "info" and e.f == "committed":
            key = (str(e.value["topic"]), str(e.value["group"]), int(e.value["partition"]))
            obs.append((e.time, e.time, key, int(e.value["offset"]), e.index))
    return obs


def _regressions(model: Model) -> list[Violation]:
    by_key: dict[tuple[str, str, int], list[tuple[float, float, int, int]]] = defaultdict(list)
    for start, end, key, offset, entry in _observations(model):
        by_key[key].append((start, end, offset, entry))
    bad: list[str] = []
    entries: list[int] = []
    for (topic, group, p), obs in sorted(by_key.items()):
        done_sorted = sorted(obs, key=lambda o: o[1])
        i = 0
        high: tuple[int, int] | None = None  # highest position known committed before `start`
        for start, _end, offset, entry in sorted(obs, key=lambda o: o[0]):
            while i < len(done_sorted) and done_sorted[i][1] < start:
                if high is None or done_sorted[i][2] > high[0]:
                    high = (done_sorted[i][2], done_sorted[i][3])
                i += 1
            if high is not None and offset < high[0]:
                bad.append(f"{topic}/{group}/{p}: {offset} after {high[0]}{_answered_by(model, entry)}")
                entries += [high[1], entry]
    return [violation("group-regress", f"{len(bad)} committed group position(s) went back", bad, entries)] \
        if bad else []


def _answered_by(model: Model, entry: int) -> str:
    """`` (read on NODE at index N)`` for a poll that names the node that answered it."""
    found = next((e for e in model.entries if e.index == entry), None)
    if found is None or found.f != "committed" or not found.value.get("node"):
        return ""
    return f" (read on {found.value['node']} at index {found.value.get('applied_index', '?')})"


def _undelivered(model: Model) -> list[Violation]:
    drained = {(str(e.value["topic"]), str(e.value["group"])) for e in model.entries
               if e.type == "info" and e.f == "group-drained"}
    delivered: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
    for e in model.entries:
        if e.type == "info" and e.f == "deliver":
            delivered[(str(e.value["topic"]), str(e.value["group"]))].add(
                (int(e.value["partition"]), int(e.value["offset"])))
    refs = reference_reads(model)
    out = []
    for topic, group in sorted(drained):
        missing = [f"{p}:{o}={rid}" for (t, p), fr in sorted(refs.items()) if t == topic
                   for o, rid in fr.records if (p, o) not in delivered[(topic, group)]]
        if missing:
            out.append(violation("undelivered", f"{len(missing)} record(s) of {topic} never delivered to group "
                                 f"{group}", missing))
    return out


def _late_redeliveries(model: Model) -> list[Violation]:
    last: dict[tuple[str, str, int, int], tuple[float, int]] = {}
    late: list[str] = []
    entries: list[int] = []
    for e in model.entries:
        if e.type != "info" or e.f != "deliver":
            continue
        key = (str(e.value["topic"]), str(e.value["group"]), int(e.value["partition"]), int(e.value["offset"]))
        before = last.get(key)
        if before is not None and e.time - before[0] > REDELIVERY_GAP_MAX_S:
            late.append(f"{key[0]}/{key[1]}/{key[2]}:{key[3]} delivered again after {e.time - before[0]:.1f} s")
            entries += [before[1], e.index]
        last[key] = (e.time, e.index)
    return [violation("redelivery-late", f"{len(late)} record(s) delivered again more than "
                      f"{REDELIVERY_GAP_MAX_S:g} s after their previous delivery", late, entries)] if late else []
