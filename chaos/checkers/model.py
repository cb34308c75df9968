"""What the checkers read out of a history: publishes, reads, final reads, faults, status polls.

History shapes (produced by ``chaos.workloads`` and ``chaos.drill``, or written by hand in tests):
- ``publish`` invoke ``{"topic", "records": [[id, partition], ...]}``; ok ``{"results":
  [[partition, offset, duplicate], ...]}`` (request order); fail/info ``{"error", "message"}``.
  A record's id is its value and its idempotency key.
- ``read`` info ``{"topic", "partition", "records": [[offset, id], ...]}``: what a stateless reader
  was delivered, in delivery order; ``read-event`` info ``{"topic", "partition", "event",
  "offset_before", "offset_after"}``; ``read-restart`` info ``{"topic", "partition"}``.
- ``final-read`` info ``{"node", "topic", "partition", "records": [[offset, id], ...],
  "timestamps_ms": [timestamp_ms, ...], "events": [{"event", "offset_before", "offset_after",
  "detail"}], "error": str | null, "leader": bool}``; ``timestamps_ms`` is parallel to ``records``
  (absent in histories written before it: the timestamp check is then skipped).
- ``status`` info ``{"node", "role", "term", "leader_id"}``.
- ``fault`` / ``heal`` info ``{"id", "kind", ...}``; ``converged`` info ``{"applied_index"}``.
- groups: ``deliver`` info ``{"topic", "group", "member", "partition", "offset", "id"}``;
  ``commit`` invoke/ok/fail/info ``{"topic", "group", "partition", "offset"}``; ``committed`` info
  (a poll of the committed position) with the same fields; ``group-drained`` info
  ``{"topic", "group"}`` (the workload read everything to the end before stopping).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.history import Entry, pairs

RECORDS_NAMED_MAX = 20  # a violation names at most this many records, and counts the rest

Position = tuple[int, int]  # (partition, offset)


@dataclass(frozen=True)
class Violation:
    """One anomaly: its kind, a sentence, the records involved (ids or ``p:offset``) and the
    history entries (indexes) that show it."""

    kind: str
    detail: str
    records: tuple[str, ...] = ()
    entries: tuple[int, ...] = ()
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "detail": self.detail, "records": list(self.records),
                "entries": list(self.entries), "count": self.count}


def violation(kind: str, detail: str, records: list[str], entries: list[int] | None = None) -> Violation:
    """A violation naming at most ``RECORDS_NAMED_MAX`` records (``count`` says how many there were)."""
    return Violation(kind, detail, tuple(records[:RECORDS_NAMED_MAX]), tuple((entries or [])[:RECORDS_NAMED_MAX]),
                     max(1, len(records)))


@dataclass
class RecordFate:
    """Everything the history says about one published record (by id)."""

    id: str
    topic: str
    partition: int
    first_invoke_time: float
    first_invoke_entry: int
    acks: list[tuple[Position, float, int]] = field(default_factory=list)  # (position, ok time, entry)
    definite_failures: int = 0
    unknown_outcomes: int = 0
    batch_index: int = 0  # place inside its first batch

    @property
    def acked(self) -> bool:
        return bool(self.acks)

    @property
    def first_ack_time(self) -> float:
        return min(t for _, t, _ in self.acks)


@dataclass
class FinalRead:
    """One node's full read of one partition after healing."""

    node: str
    topic: str
    partition: int
    records: list[tuple[int, str]]
    events: list[dict[str, Any]]
    error: str | None
    leader: bool
    entry: int
    timestamps_ms: list[int] | None = None  # parallel to records; None when the history has none


@dataclass
class Model:
    """The parsed history."""

    records: dict[str, RecordFate]
    publish_ops: list[tuple[Entry, Entry | None]]
    final_reads: list[FinalRead]
    entries: list[Entry]

    def final_by_node(self) -> dict[str, dict[tuple[str, int], FinalRead]]:
        out: dict[str, dict[tuple[str, int], FinalRead]] = defaultdict(dict)
        for fr in self.final_reads:
            out[fr.node][(fr.topic, fr.partition)] = fr
        return out


def parse(entries: list[Entry]) -> Model:
    """Index a history for the checkers."""
    records: dict[str, RecordFate] = {}
    ops = list(pairs(entries, "publish"))
    for inv, done in ops:
        topic = str(inv.value["topic"])
        recs = [(str(r[0]), int(r[1])) for r in inv.value["records"]]
        for k, (rid, partition) in enumerate(recs):
            fate = records.get(rid)
            if fate is None:
                fate = records[rid] = RecordFate(rid, topic, partition, inv.time, inv.index, batch_index=k)
            if done is None or done.type == "info":
                fate.unknown_outcomes += 1
            elif done.type == "fail":
                fate.definite_failures += 1
            else:
                p, o, _dup = done.value["results"][k]
                fate.acks.append(((int(p), int(o)), done.time, done.index))
    reads = [FinalRead(str(e.value["node"]), str(e.value["topic"]), int(e.value["partition"]),
                       [(int(o), str(i)) for o, i in e.value.get("records", [])], list(e.value.get("events", [])),
                       e.value.get("error"), bool(e.value.get("leader", False)), e.index,
                       _timestamps(e.value))
             for e in entries if e.f == "final-read" and e.type == "info"]
    latest = {(fr.node, fr.topic, fr.partition): fr for fr in reads}  # a later read of a node replaces one
    return Model(records, ops, list(latest.values()), entries)


def _timestamps(value: dict[str, Any]) -> list[int] | None:
    """A final read's record timestamps, or None when it has none (older histories) or they do not
    match its records one to one."""
    raw = value.get("timestamps_ms")
    if raw is None or len(raw) != len(value.get("records", [])):
        return None
    return [int(t) for t in raw]
