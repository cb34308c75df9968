"""Record timestamps never go back within a partition (log-append time, whatever the nodes' clocks
did): in every node's final read, each record's ``timestamp_ms`` is at least its predecessor's.
Subscribing from a timestamp and retention by age binary-search on it.

Every node is checked (replicas apply the same commands, so a regression normally shows on all
of them): one violation per partition names each regressing record once, with the nodes that
serve it.
"""

from __future__ import annotations

from collections import defaultdict

from chaos.checkers.model import FinalRead, Model, Violation, violation

Stamped = tuple[int, str, int]  # (offset, id, timestamp_ms)


def check_timestamps(model: Model) -> list[Violation]:
    """A ``timestamp-regression`` per partition whose records' timestamps decrease on some node."""
    drops: dict[tuple[str, int], dict[tuple[Stamped, Stamped], list[str]]] = defaultdict(dict)
    entries: dict[tuple[str, int], list[int]] = defaultdict(list)
    for fr in sorted(model.final_reads, key=lambda f: (f.topic, f.partition, f.node)):
        found = _regressions(fr)
        for pair in found:
            drops[(fr.topic, fr.partition)].setdefault(pair, []).append(fr.node)
        if found:
            entries[(fr.topic, fr.partition)].append(fr.entry)
    out: list[Violation] = []
    for (topic, p), pairs in sorted(drops.items()):
        named = [f"{p}:{o}={rid} ts={ts} < {p}:{po}={prid} ts={pts} ({ts - pts:+d} ms) on {','.join(nodes)}"
                 for ((po, prid, pts), (o, rid, ts)), nodes in sorted(pairs.items())]
        out.append(violation("timestamp-regression", f"{len(named)} record(s) of {topic}/{p} carry a timestamp "
                             "lower than the record before them", named, entries[(topic, p)]))
    return out


def _regressions(fr: FinalRead) -> list[tuple[Stamped, Stamped]]:
    """(predecessor, record) for each record of a read whose timestamp is below its predecessor's."""
    if fr.error is not None or fr.timestamps_ms is None:
        return []
    out: list[tuple[Stamped, Stamped]] = []
    prev: Stamped | None = None
    for (offset, rid), ts in zip(fr.records, fr.timestamps_ms, strict=True):
        cur = (offset, rid, ts)
        if prev is not None and ts < prev[2]:
            out.append((prev, cur))
        prev = cur
    return out
