"""After healing, every node holds the same log: each partition read from each node must equal the
reference read, and every node must be readable at all. A ``badmsg`` event in a node's read (a
stored record failed its checksum) means that node lost the record: it is a divergence too.

Every node also decided every command alike: their digests of apply outcomes
(``broker/core/apply_digest.py``, read once the nodes converged) must agree (``apply-divergence``).
That covers what the reads cannot see: groups, dedup state, topic metadata."""

from __future__ import annotations

from chaos.checkers.log import reference_reads
from chaos.checkers.model import Model, Violation, violation
from chaos.history import Entry


def check_replicas(model: Model) -> list[Violation]:
    refs = reference_reads(model)
    out: list[Violation] = []
    for fr in sorted(model.final_reads, key=lambda f: (f.topic, f.partition, f.node)):
        if fr.error is not None:
            out.append(violation("final-read-failed", f"{fr.node} could not be read after healing "
                                 f"({fr.topic}/{fr.partition}): {fr.error}", [f"{fr.node}:{fr.partition}"],
                                 [fr.entry]))
            continue
        bad_events = [ev for ev in fr.events if ev.get("event") == "badmsg"]
        if bad_events:
            out.append(violation("replica-divergence", f"{fr.node} serves {len(bad_events)} corrupted record(s) of "
                                 f"{fr.topic}/{fr.partition} (badmsg)",
                                 [f"{fr.partition}:{ev.get('offset_before')} {ev.get('detail', '')}".strip()
                                  for ev in bad_events], [fr.entry]))
        ref = refs.get((fr.topic, fr.partition))
        if ref is None or ref is fr or ref.records == fr.records:
            continue
        out.append(_divergence(ref.node, ref.records, fr.node, fr.records, fr.topic, fr.partition,
                               [ref.entry, fr.entry]))
    return out


def _divergence(ref_node: str, ref: list[tuple[int, str]], node: str, got: list[tuple[int, str]], topic: str,
                partition: int, entries: list[int]) -> Violation:
    ref_at = dict(ref)
    got_at = dict(got)
    differing = sorted(o for o in set(ref_at) | set(got_at) if ref_at.get(o) != got_at.get(o))
    named = [f"{partition}:{o} {ref_node}={ref_at.get(o, '-')} {node}={got_at.get(o, '-')}" for o in differing]
    return violation("replica-divergence", f"{node} and {ref_node} disagree on {len(differing)} offset(s) of "
                     f"{topic}/{partition} (from offset {differing[0] if differing else '?'}; "
                     f"{len(got)} vs {len(ref)} records)", named, entries)


def apply_digests(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.type == "info" and e.f == "apply-digests" and isinstance(e.value, dict)]


def check_apply_digests(entries: list[Entry]) -> list[Violation]:
    out: list[Violation] = []
    for e in apply_digests(entries):
        differing = e.value.get("differing") or []
        if differing:
            digests = e.value.get("digests", {})
            out.append(violation("apply-divergence", f"at index {e.value.get('index')}, {', '.join(differing)} "
                                 "decided some command differently from the other nodes (their apply digests differ)",
                                 [f"{n}={d}" for n, d in sorted(digests.items())], [e.index]))
    return out


def apply_digests_skipped(entries: list[Entry]) -> str | None:
    """Why the apply digests could not be compared (None when they were)."""
    found = apply_digests(entries)
    if not found:
        return "no verification"
    value = found[-1].value
    if "error" in value:
        return f"the verification failed: {value['error']}"
    if len(value.get("digests", {})) < 2:
        errors = sorted(set(value.get("errors", {}).values()))
        return "fewer than two nodes gave a digest" + (f" ({'; '.join(errors)})" if errors else "")
    return None
