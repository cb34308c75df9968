"""Checks of the log against the history: nothing acknowledged lost, nothing stored twice, one value
per offset, order kept, offsets contiguous, nothing stored that was never (or definitely not)
published.

The final read of a reference node stands for the cluster's log (``replicas.py`` separately proves
that every other node holds the same); the reference is the node that led at the final read, else
the one with a complete read holding the most records.
"""

from __future__ import annotations

from collections import defaultdict

from chaos.checkers.model import FinalRead, Model, Position, Violation, violation


def reference_reads(model: Model) -> dict[tuple[str, int], FinalRead]:
    """The final read that stands for each (topic, partition)."""
    best: dict[tuple[str, int], FinalRead] = {}
    for fr in model.final_reads:
        if fr.error is not None:
            continue
        key = (fr.topic, fr.partition)
        cur = best.get(key)
        if cur is None or _rank(fr) > _rank(cur):
            best[key] = fr
    return best


def _rank(fr: FinalRead) -> tuple[bool, int, str]:
    return fr.leader, len(fr.records), fr.node


def stored_positions(refs: dict[tuple[str, int], FinalRead]) -> tuple[dict[str, list[Position]], dict[str, Position]]:
    """Every position of every id in the reference reads, and the first position of each id."""
    where: dict[str, list[Position]] = defaultdict(list)
    for (_topic, p), fr in sorted(refs.items()):
        for offset, rid in fr.records:
            where[rid].append((p, offset))
    return where, {rid: ps[0] for rid, ps in where.items()}


def check_log(model: Model) -> list[Violation]:
    """Lost, duplicated, phantom, misplaced and reordered records; gaps in offsets."""
    refs = reference_reads(model)
    if not refs:
        return []
    where, first = stored_positions(refs)
    out: list[Violation] = []
    out += _lost(model, refs, first)
    out += _duplicates(where)
    out += _phantoms(model, where)
    out += _contiguity(refs)
    out += _ack_positions(model, refs, first)
    out += _order(model, first)
    return out


def _lost(model: Model, refs: dict[tuple[str, int], FinalRead], first: dict[str, Position]) -> list[Violation]:
    lost: dict[tuple[str, int], list[str]] = defaultdict(list)
    entries: dict[tuple[str, int], list[int]] = defaultdict(list)
    for fate in model.records.values():
        key = (fate.topic, fate.partition)
        if fate.acked and fate.id not in first and key in refs:
            lost[key].append(fate.id)
            entries[key].append(fate.acks[0][2])
    return [violation("lost-write", f"{len(ids)} acknowledged record(s) of {t}/{p} are not in the log "
                      f"(reference node {refs[(t, p)].node})", ids, entries[(t, p)])
            for (t, p), ids in sorted(lost.items())]


def _duplicates(where: dict[str, list[Position]]) -> list[Violation]:
    dups = sorted((rid, ps) for rid, ps in where.items() if len(ps) > 1)
    if not dups:
        return []
    named = [f"{rid}@{','.join(f'{p}:{o}' for p, o in ps)}" for rid, ps in dups]
    return [violation("duplicate", f"{len(dups)} record(s) stored more than once despite their idempotency keys "
                      "or producer session", named)]


def _phantoms(model: Model, where: dict[str, list[Position]]) -> list[Violation]:
    never = sorted(rid for rid in where if rid not in model.records)
    failed = sorted(rid for rid, fate in model.records.items()
                    if rid in where and fate.definite_failures and not fate.acked and not fate.unknown_outcomes)
    out = []
    if never:
        out.append(violation("phantom-write", f"{len(never)} stored record(s) were never published", never))
    if failed:
        out.append(violation("phantom-write", f"{len(failed)} record(s) whose every publish definitely failed "
                             "are stored", failed, [model.records[r].first_invoke_entry for r in failed]))
    return out


def _contiguity(refs: dict[tuple[str, int], FinalRead]) -> list[Violation]:
    out = []
    for (t, p), fr in sorted(refs.items()):
        offsets = [o for o, _ in fr.records]
        expected = list(range(offsets[0], offsets[0] + len(offsets))) if offsets else []
        bad = [f"{p}:{o}" for o, e in zip(offsets, expected, strict=True) if o != e]
        if offsets and offsets[0] != 0 and not any(ev.get("event") == "skip_forward" for ev in fr.events):
            bad.insert(0, f"{p}:start={offsets[0]}")
        if bad:
            out.append(violation("non-contiguous", f"offsets of {t}/{p} on {fr.node} are not contiguous from 0",
                                 bad, [fr.entry]))
    return out


def _ack_positions(model: Model, refs: dict[tuple[str, int], FinalRead],
                   first: dict[str, Position]) -> list[Violation]:
    """Every acknowledgement names where the record is; two records never share an offset."""
    at: dict[tuple[str, Position], str] = {}
    for (t, _p), fr in refs.items():
        for o, rid in fr.records:
            at[(t, (fr.partition, o))] = rid
    bad: list[str] = []
    entries: list[int] = []
    acked_at: dict[tuple[str, Position], str] = {}
    for fate in sorted(model.records.values(), key=lambda f: f.first_invoke_entry):
        for pos, _t, entry in fate.acks:
            other = acked_at.setdefault((fate.topic, pos), fate.id)
            stored = at.get((fate.topic, pos))
            if other != fate.id:
                bad.append(f"{pos[0]}:{pos[1]} acked for {other} and {fate.id}")
                entries.append(entry)
            elif fate.id in first and stored is not None and stored != fate.id:
                bad.append(f"{pos[0]}:{pos[1]} acked for {fate.id}, holds {stored}")
                entries.append(entry)
            elif fate.id in first and first[fate.id] != pos:
                bad.append(f"{fate.id} acked at {pos[0]}:{pos[1]}, stored at {first[fate.id][0]}:{first[fate.id][1]}")
                entries.append(entry)
    return [violation("inconsistent-offset", f"{len(bad)} acknowledgement(s) disagree with the log", bad, entries)] \
        if bad else []


def _order(model: Model, first: dict[str, Position]) -> list[Violation]:
    """A record acknowledged before another was first sent sits at a lower offset of its partition;
    records of one batch keep their batch order."""
    bad: list[str] = []
    by_partition: dict[tuple[str, int], list[tuple[float, float, int, str]]] = defaultdict(list)
    for fate in model.records.values():
        if fate.id in first and first[fate.id][0] == fate.partition:
            ack_time = fate.first_ack_time if fate.acked else float("inf")
            by_partition[(fate.topic, fate.partition)].append(
                (fate.first_invoke_time, ack_time, first[fate.id][1], fate.id))
    for _key, recs in sorted(by_partition.items()):
        by_ack = sorted(recs, key=lambda r: r[1])
        i = 0
        best: tuple[int, str] | None = None  # highest offset among records acked so far
        for invoke_time, _ack, offset, rid in sorted(recs, key=lambda r: r[0]):
            while i < len(by_ack) and by_ack[i][1] < invoke_time:
                if best is None or by_ack[i][2] > best[0]:
                    best = (by_ack[i][2], by_ack[i][3])
                i += 1
            if best is not None and best[0] >= offset:
                bad.append(f"{rid}@{offset} after {best[1]}@{best[0]}")
    for inv, _done in model.publish_ops:
        last: dict[int, tuple[int, str]] = {}
        for rid, _p in ((str(r[0]), int(r[1])) for r in inv.value["records"]):
            pos = first.get(rid)
            owner = model.records.get(rid)
            if pos is None or owner is None or owner.first_invoke_entry != inv.index:
                continue
            prev = last.get(pos[0])
            if prev is not None and prev[0] >= pos[1]:
                bad.append(f"{rid}@{pos[1]} before {prev[1]}@{prev[0]} in one batch")
            last[pos[0]] = (pos[1], rid)
    return [violation("reorder", f"{len(bad)} record(s) stored out of order", bad)] if bad else []
