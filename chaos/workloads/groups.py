"""Consumer groups under faults (SPEC §3.2): a queue-mode and a stream-mode group on the drill's
topic, each with :data:`MEMBERS_PER_GROUP` members that ack with random delays, nack (queue mode),
commit (stream mode), hold records past their lease, and crash now and then
(:mod:`chaos.workloads.group_member`); plus a poll of each group's committed positions.

Short visibility and session timeouts (:data:`GROUP_CONFIG`) make expired leases, redeliveries
and partition moves happen within a 20 s drill. History entries (read by ``chaos/checkers/groups.py``;
every ``deliver``/``commit``/``committed`` goes through a :class:`~chaos.workloads.group_ledger.GroupLedger`):
- ``deliver`` info ``{"topic", "group", "member", "partition", "offset", "id", "attempt"}`` per
  record a member took from its consumer (``id``: the record's value);
- ``commit`` invoke/ok/fail/info ``{"topic", "group", "partition", "offset"}``: a stream-mode
  commit above every committed position observed so far (an acknowledged one proves the position
  is at least ``offset``; ``Ack`` reports no position, so acks are recorded as ``ack``/``nack``
  invoke ``{"topic", "group", "member", "records": [[partition, offset], ...]}`` and ok/info);
- ``committed`` info (same fields, plus ``end``, ``lag``, ``in_flight``, ``retrying``, ``dead``, and
  ``node`` / ``applied_index``: who answered and the Raft index the answer reflects) for each
  partition at every :data:`POLL_PERIOD_S` poll of ``Admin.GroupLag``; ``committed`` fail
  ``{"topic", "group", "error"}`` when a poll failed (no value is recorded then);
- ``group-config`` info ``{"topic", "group", "mode", "visibility_timeout_ms", ...}`` once per group
  at start (the liveness checker bounds redeliveries by the visibility timeout);
- ``group-drained`` info ``{"topic", "group", "after_s"}`` once, after the final reads, the
  group's committed positions reached the end of every partition with nothing unsettled; or
  ``group-not-drained`` info (with the last positions seen) if that did not happen in time;
- ``member-start`` / ``member-crash`` / ``member-error`` / ``group-event`` info, for the operator;
- ``workload-unavailable`` info ``{"workload": "groups", "reason"}`` when the groups could not be
  created (the broker refused: e.g. a topic class without groups).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from broker.client import BrokerError, Client, GroupExists, GroupLag
from chaos.history import History
from chaos.workloads.group_ledger import GroupLedger
from chaos.workloads.group_member import GroupMember, MemberPlan

WORKLOAD = "groups"
MEMBERS_PER_GROUP = 2
GROUP_CONFIG: dict[str, Any] = {"visibility_timeout_ms": 2500, "session_timeout_ms": 2500, "backoff": "fixed",
                                "base_delay_ms": 200, "max_attempts": 1000}  # no dead letters in a drill
MAX_IN_FLIGHT = 100
GROUP_MODES = {"chaos-queue": "queue", "chaos-stream": "stream"}  # name -> mode
POLL_PERIOD_S = 0.5
DRAIN_TIMEOUT_S = 30.0
HALT_JOIN_S = 10.0  # for every thread together


def group_config(mode: str) -> dict[str, Any]:
    """:data:`GROUP_CONFIG` as a group of ``mode`` takes it: a queue-mode group has no member sessions,
    and the broker and SDK refuse a session timeout for one (INVALID_ARGUMENT)."""
    return {k: v for k, v in GROUP_CONFIG.items() if mode == "stream" or k != "session_timeout_ms"}


class LagPoller(threading.Thread):
    """Polls ``Admin.GroupLag`` of each group every ``period_s`` into its ledger; keeps the latest
    answer per group with the monotonic time its request was sent (for :meth:`GroupWorkload.await_drained`)."""

    def __init__(self, make_client: Callable[[], Client], ledgers: list[GroupLedger], period_s: float) -> None:
        super().__init__(name="group-lag", daemon=True)
        self.process = "group-lag"
        self.client = make_client()
        self.ledgers = ledgers
        self.period_s = period_s
        self.halted = threading.Event()
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, GroupLag]] = {}

    def latest(self, group: str) -> tuple[float, GroupLag] | None:
        with self._lock:
            return self._latest.get(group)

    def run(self) -> None:
        while not self.halted.is_set():
            started = time.monotonic()
            for ledger in self.ledgers:
                self._poll(ledger)
            self.halted.wait(max(0.0, self.period_s - (time.monotonic() - started)))

    def _poll(self, ledger: GroupLedger) -> None:
        token = ledger.poll_token()
        sent = time.monotonic()
        try:
            lag = self.client.groups.lag(ledger.topic, ledger.group)
        except Exception as err:  # a fault, or the client closed at halt: nothing to record but the error
            if not self.halted.is_set():
                ledger.poll_failed(self.process, err)
            return
        ledger.polled(self.process, lag.partitions, token, lag.node, lag.applied_index)
        with self._lock:
            self._latest[ledger.group] = (sent, lag)

    def halt(self) -> None:
        self.halted.set()
        self.client.close()


class GroupWorkload:
    """Both groups, their members and the poller. ``calm``: once set (the producers stopped),
    members stop crashing, nacking and holding records, so the groups drain."""

    def __init__(self, make_client: Callable[[], Client], topic: str, partitions: int, history: History,
                 rng: random.Random, calm: threading.Event) -> None:
        self.make_client = make_client
        self.topic = topic
        self.history = history
        self.rng = rng
        self.calm = calm
        self.ledgers = [GroupLedger(history, topic, group, partitions) for group in GROUP_MODES]
        self.members: list[GroupMember] = []
        self.poller: LagPoller | None = None

    def start(self) -> str | None:
        """Create the groups and start every thread; return why the workload cannot run (recorded
        as ``workload-unavailable``), or ``None``."""
        why = self._create_groups()
        if why is not None:
            self.history.info("drill", "workload-unavailable", {"workload": WORKLOAD, "reason": why})
            return why
        for ledger in self.ledgers:
            mode = GROUP_MODES[ledger.group]
            self.history.info(WORKLOAD, "group-config", {"topic": self.topic, "group": ledger.group, "mode": mode,
                                                         **group_config(mode)})
            plan = MemberPlan(mode, {**group_config(mode), "max_in_flight": MAX_IN_FLIGHT},
                              hold_s=GROUP_CONFIG["visibility_timeout_ms"] / 1000 + 0.5)
            for k in range(MEMBERS_PER_GROUP):
                self.members.append(GroupMember(f"g{mode[0]}{k}", plan, self.make_client, ledger, self.history,
                                                random.Random(self.rng.getrandbits(64)), self.calm))
        self.poller = LagPoller(self.make_client, self.ledgers, POLL_PERIOD_S)
        for t in [*self.members, self.poller]:
            t.start()
        return None

    def _create_groups(self) -> str | None:
        with self.make_client() as admin:
            for group, mode in GROUP_MODES.items():
                try:
                    admin.groups.create(self.topic, group, mode, **group_config(mode))
                except GroupExists:
                    continue  # a retried create that had been applied
                except BrokerError as err:
                    return f"could not create the {mode}-mode group {group}: {err.code}: {err.message}"
        return None

    def await_drained(self, ends: dict[int, int], timeout_s: float = DRAIN_TIMEOUT_S) -> list[str]:
        """Wait (bounded) until each group settled every record up to ``ends`` (the end offset per
        partition of the final read), as seen by a poll sent after this call; record
        ``group-drained`` or ``group-not-drained`` per group. Returns the groups not drained."""
        if self.poller is None:
            return []
        called = time.monotonic()
        deadline = called + timeout_s
        pending = {ledger.group for ledger in self.ledgers}
        while pending and time.monotonic() < deadline:
            for group in sorted(pending):
                if self._drained(group, called, ends):
                    pending.discard(group)
                    self.history.info(WORKLOAD, "group-drained", {"topic": self.topic, "group": group,
                                                                  "after_s": round(time.monotonic() - called, 3)})
            time.sleep(0.05)
        for group in sorted(pending):
            seen = self.poller.latest(group)
            self.history.info(WORKLOAD, "group-not-drained", {
                "topic": self.topic, "group": group, "ends": {str(p): o for p, o in ends.items()},
                "committed": None if seen is None else {str(r.partition): r.committed for r in seen[1].partitions},
                "lag": None if seen is None else seen[1].lag})
        return sorted(pending)

    def _drained(self, group: str, since: float, ends: dict[int, int]) -> bool:
        seen = self.poller.latest(group) if self.poller is not None else None
        if seen is None or seen[0] < since:
            return False
        return all(r.lag == 0 and r.committed >= ends.get(r.partition, 0) for r in seen[1].partitions)

    def halt(self) -> None:
        """Stop every thread (bounded: their clients are closed, so no call blocks) and record a summary."""
        threads: list[GroupMember | LagPoller] = [*self.members, *([self.poller] if self.poller else [])]
        for t in threads:
            t.halt()
        deadline = time.monotonic() + HALT_JOIN_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self.poller is not None:
            self.history.info(WORKLOAD, "group-summary", self.summary())

    def summary(self) -> dict[str, Any]:
        """Per group: deliveries, acknowledged commits, `committed` entries recorded and polls left out
        (ambiguous), sessions, crashes, members still alive."""
        out: dict[str, Any] = {}
        for ledger in self.ledgers:
            members = [m for m in self.members if m.ledger is ledger]
            out[ledger.group] = {"deliveries": ledger.deliveries, "commits_ok": ledger.commits_ok,
                                 "committed_entries": ledger.polls_recorded, "polls_left_out": ledger.ambiguous_polls,
                                 "sessions": sum(m.sessions for m in members),
                                 "crashes": sum(m.crashes for m in members),
                                 "alive": [m.process for m in members if m.is_alive()]}
        return out
