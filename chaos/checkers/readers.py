"""Checks of what stateless readers were delivered during the run: every delivered offset holds
the value the log finally holds (no dirty or phantom reads), and a reader never skips offsets
unless the stream said so with an event (SPEC §3.3: loss is never silent)."""

from __future__ import annotations

from collections import defaultdict

from chaos.checkers.log import reference_reads
from chaos.checkers.model import Model, Violation, violation

_SKIP_EVENTS = ("skip_forward", "gap", "badmsg", "reset")


def check_readers(model: Model) -> list[Violation]:
    refs = reference_reads(model)
    final: dict[tuple[str, int, int], str] = {}
    for (t, p), fr in refs.items():
        for o, rid in fr.records:
            final[(t, p, o)] = rid
    last: dict[tuple[str, str, int], int] = {}
    excused: set[tuple[str, str, int]] = set()
    dirty: list[str] = []
    dirty_entries: list[int] = []
    skips: list[str] = []
    skip_entries: list[int] = []
    backwards: list[str] = []
    for e in model.entries:
        if e.type != "info" or e.f not in ("read", "read-event", "read-restart"):
            continue
        key = (e.process, str(e.value["topic"]), int(e.value["partition"]))
        if e.f == "read-event":
            if e.value.get("event") in _SKIP_EVENTS:
                excused.add(key)
            continue
        if e.f == "read-restart":
            continue
        t, p = key[1], key[2]
        for o, rid in e.value["records"]:
            o, rid = int(o), str(rid)
            prev = last.get(key)
            if prev is not None and o > prev + 1 and key not in excused:
                skips.append(f"{e.process} {p}:{prev + 1}..{o - 1}")
                skip_entries.append(e.index)
            elif prev is not None and o <= prev and final.get((t, p, o)) != rid:
                backwards.append(f"{e.process} {p}:{o} after {p}:{prev}")
            excused.discard(key)
            last[key] = max(o, prev if prev is not None else -1)
            stored = final.get((t, p, o))
            if (t, p) in refs and stored != rid:
                dirty.append(f"{e.process} read {rid} at {p}:{o}, log holds {stored or 'nothing'}")
                dirty_entries.append(e.index)
    out: list[Violation] = []
    if dirty:
        out.append(violation("inconsistent-offset", f"{len(dirty)} read(s) saw a value the log does not hold there",
                             dirty, dirty_entries))
    if skips:
        out.append(violation("silent-skip", f"{len(skips)} gap(s) in what readers were delivered, without an event",
                             skips, skip_entries))
    if backwards:
        out.append(violation("reorder", f"{len(backwards)} read(s) went back to an offset with another value",
                             backwards))
    return out


def reader_counts(model: Model) -> dict[str, int]:
    """Records delivered to readers, per reader."""
    counts: dict[str, int] = defaultdict(int)
    for e in model.entries:
        if e.type == "info" and e.f == "read":
            counts[e.process] += len(e.value["records"])
    return dict(counts)
