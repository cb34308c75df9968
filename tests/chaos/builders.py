"""Hand-made drill histories for checker tests: a tiny clock and one method per history shape."""

from __future__ import annotations

from typing import Any

from chaos.history import Entry

TOPIC = "t"


class Hist:
    """Appends entries with increasing times (each call advances the clock by ``step``)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.t = 0.0

    def add(self, type_: str, process: str, f: str, value: Any, dt: float = 0.1) -> Entry:
        self.t += dt
        e = Entry(len(self.entries), type_, process, f, value, self.t)
        self.entries.append(e)
        return e

    def publish(self, process: str, records: list[tuple[str, int]], results: list[tuple[int, int]] | None,
                outcome: str = "ok") -> None:
        """One publish op; ``results`` (partition, offset) per record when ``outcome`` is ok."""
        self.add("invoke", process, "publish", {"topic": TOPIC, "records": [list(r) for r in records]})
        if outcome == "ok":
            assert results is not None
            self.add("ok", process, "publish", {"results": [[p, o, False] for p, o in results]})
        else:
            self.add(outcome, process, "publish", {"error": "UNAVAILABLE", "message": "x"})

    def final(self, node: str, partition: int, records: list[tuple[int, str]], *, leader: bool = False,
              events: list[dict[str, Any]] | None = None, error: str | None = None,
              timestamps_ms: list[int] | None = None) -> None:
        """One node's final read; ``timestamps_ms`` (parallel to ``records``) is left out when None,
        as in histories written before it existed."""
        value: dict[str, Any] = {"node": node, "topic": TOPIC, "partition": partition,
                                 "records": [list(r) for r in records], "events": events or [], "error": error,
                                 "leader": leader}
        if timestamps_ms is not None:
            value["timestamps_ms"] = timestamps_ms
        self.add("info", "checker", "final-read", value)

    def finals(self, partition: int, records: list[tuple[int, str]], nodes: tuple[str, ...] = ("n1", "n2", "n3"),
               timestamps_ms: list[int] | None = None) -> None:
        for i, n in enumerate(nodes):
            self.final(n, partition, records, leader=i == 0, timestamps_ms=timestamps_ms)

    def status(self, node: str, role: str, term: int) -> None:
        self.add("info", f"status-{node}", "status", {"node": node, "role": role, "term": term, "leader_id": ""})

    def read(self, process: str, partition: int, records: list[tuple[int, str]]) -> None:
        value = {"topic": TOPIC, "partition": partition, "records": [list(r) for r in records]}
        self.add("info", process, "read", value)

    def fault(self, fid: int, kind: str = "kill") -> None:
        self.add("info", "nemesis", "fault", {"id": fid, "kind": kind, "targets": ["n1"]})

    def heal(self, fid: int, dt: float = 0.1) -> None:
        self.add("info", "nemesis", "heal", {"id": fid}, dt)


def clean() -> Hist:
    """A clean history: two producers, two partitions, a fault healed, a reader, agreeing replicas."""
    h = Hist()
    h.status("n1", "leader", 1)
    h.status("n2", "follower", 1)
    h.publish("p0", [("a0", 0), ("a1", 0)], [(0, 0), (0, 1)])
    h.publish("p1", [("b0", 1)], [(1, 0)])
    h.fault(1)
    h.publish("p0", [("a2", 0)], None, outcome="info")   # unknown outcome, was stored
    h.publish("p1", [("b1", 1)], None, outcome="fail")   # definitely failed, not stored
    h.status("n2", "leader", 2)
    h.heal(1)
    h.publish("p0", [("a2", 0), ("a3", 0)], [(0, 2), (0, 3)])  # retry with the same keys
    h.publish("p1", [("b2", 1)], [(1, 1)])
    h.read("r0", 0, [(0, "a0"), (1, "a1"), (2, "a2")])
    h.read("r0", 0, [(3, "a3")])
    h.finals(0, [(0, "a0"), (1, "a1"), (2, "a2"), (3, "a3")], timestamps_ms=[1000, 1000, 1200, 1300])
    h.finals(1, [(0, "b0"), (1, "b2")], timestamps_ms=[1000, 1400])
    return h
