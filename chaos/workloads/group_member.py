"""One member of a consumer group under faults: a thread with its own SDK client and consumer.

A *session* is one incarnation of the member: a new :class:`~broker.client.Client`, a consumer
with a new member id, and a pump thread that iterates the consumer into a queue (so records are
settled on time even while nothing arrives). The member thread takes each record, records its
delivery (:class:`~chaos.workloads.group_ledger.GroupLedger`), and settles it after its own random
delay: the records due are acknowledged in one ``Ack`` call; in queue mode a few are nacked
instead (delivered again after a short delay); now and then one is held past the visibility
timeout (its lease expires and it is delivered again while held); in stream mode, after some acks,
the member also commits each partition it acked up to the group's delivered prefix.

Until ``calm`` is set (the drill stops the producers), the member crashes every few seconds: it
drops its session without settling what it holds — abruptly (channels closed, no LeaveGroup: its
leases expire and, in stream mode, its partitions move once its session times out) or by closing
the consumer (LeaveGroup: its leases come back at once) — and starts a new one after a short pause.
Every random choice comes from the member's seeded RNG. :meth:`GroupMember.halt` ends everything
quickly: it closes the session's client, so no call can block the drill's teardown.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.client import Client, Consumer, Event, Message
from chaos.history import History
from chaos.workloads.group_ledger import GroupLedger

PUMP_JOIN_S = 2.0  # a dropped session's pump ends at once: its channels are closed
IDLE_WAIT_S = 0.1  # how long the member waits for an item before looking at its timers again
_END = object()


@dataclass(frozen=True)
class MemberPlan:
    """The member's behaviour (probabilities per record unless said otherwise; times in seconds)."""

    mode: str  # "queue" or "stream"
    subscribe_options: dict[str, Any]  # the group config (as for ``Client.subscribe``) and max_in_flight
    ack_delay_s_max: float = 0.25
    nack_probability: float = 0.04  # queue mode only
    nack_delay_ms_max: int = 300
    hold_probability: float = 0.003  # held past the visibility timeout
    hold_s: float = 3.0  # longer than the group's visibility timeout
    commit_probability: float = 0.3  # stream mode: per ack call, also commit the acked partitions
    crash_every_s: tuple[float, float] = (4.0, 9.0)
    crash_pause_s: tuple[float, float] = (0.3, 1.5)
    abrupt_probability: float = 0.7  # of a crash: channels closed (else the consumer is closed)


class Session:
    """One incarnation of a member: its client, its consumer, and the pump that feeds ``items``."""

    def __init__(self, client: Client, consumer: Consumer) -> None:
        self.client = client
        self.consumer = consumer
        self.items: queue.Queue[object] = queue.Queue()
        self.pump = threading.Thread(target=self._pump, name=f"pump-{consumer.member_id}", daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        try:
            for item in self.consumer:
                self.items.put(item)
            self.items.put(_END)
        except Exception as err:  # the stream failed for good, or the session was dropped
            self.items.put(err)

    def drop(self, abrupt: bool) -> None:
        """End the session without settling anything; ``abrupt``: close the channels first (no
        LeaveGroup reaches the broker, like a process that died), else close the consumer first."""
        if abrupt:
            self.client.close()
            self.consumer.close()
        else:
            self.consumer.close()
            self.client.close()
        self.pump.join(PUMP_JOIN_S)


class GroupMember(threading.Thread):
    """Consumes ``ledger.group`` until :meth:`halt`; see the module docstring."""

    def __init__(self, name: str, plan: MemberPlan, make_client: Callable[[], Client], ledger: GroupLedger,
                 history: History, rng: random.Random, calm: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.process = name
        self.plan = plan
        self.make_client = make_client
        self.ledger = ledger
        self.history = history
        self.rng = rng
        self.calm = calm
        self.halted = threading.Event()
        self._lock = threading.Lock()
        self._session: Session | None = None
        self.sessions = 0
        self.crashes = 0
        self._held: list[tuple[float, Message]] = []  # (due, message), the records not settled yet
        self._member_id = ""

    # -- sessions --------------------------------------------------------------------------------
    def _open(self) -> Session | None:
        with self._lock:
            if self.halted.is_set():
                return None
            self.sessions += 1
            self._member_id = f"{self.process}.{self.sessions}"
            client = self.make_client()
            consumer = client.subscribe(self.ledger.topic, group=self.ledger.group, mode=self.plan.mode,
                                        member_id=self._member_id, **self.plan.subscribe_options)
            self._session = Session(client, consumer)
        self.history.info(self.process, "member-start", {"group": self.ledger.group, "member": self._member_id})
        return self._session

    def _drop(self, session: Session, abrupt: bool) -> None:
        self._held = []
        with self._lock:
            self._session = None
        session.drop(abrupt)

    def run(self) -> None:
        while not self.halted.is_set():
            session = self._open()
            if session is None:
                break
            try:
                outcome = self._consume(session)
            except Exception as err:  # a workload bug must not stop the member silently
                self.history.info(self.process, "member-error", {"group": self.ledger.group, "member": self._member_id,
                                                                 "error": type(err).__name__,
                                                                 "message": str(err)[:300]})
                outcome = "error"
            abrupt = outcome != "crash" or self.rng.random() < self.plan.abrupt_probability
            self._drop(session, abrupt)
            if outcome == "crash":
                self.crashes += 1
                self.history.info(self.process, "member-crash", {"group": self.ledger.group,
                                                                 "member": self._member_id, "abrupt": abrupt})
                self.halted.wait(self.rng.uniform(*self.plan.crash_pause_s))
            elif outcome == "error":
                self.halted.wait(0.3)  # the stream failed for good (no leader for long): start over

    def halt(self) -> None:
        """Stop the member: its session's calls fail at once (the client is closed)."""
        with self._lock:
            self.halted.set()
            session = self._session
        if session is not None:
            session.client.close()

    # -- consuming -------------------------------------------------------------------------------
    def _consume(self, session: Session) -> str:
        """Take, record and settle items until the session ends: "crash", "halt" or "error"."""
        crash_at = time.monotonic() + self.rng.uniform(*self.plan.crash_every_s)
        while not self.halted.is_set():
            if not self.calm.is_set() and time.monotonic() >= crash_at:
                return "crash"
            try:
                item = session.items.get(timeout=self._wait_s())
            except queue.Empty:
                item = None
            if item is _END or isinstance(item, Exception):
                if not self.halted.is_set():
                    self.history.info(self.process, "member-error", {
                        "group": self.ledger.group, "member": self._member_id,
                        "error": getattr(item, "code", type(item).__name__), "message": str(item)[:300]})
                return "error"
            if isinstance(item, Event):
                self.history.info(self.process, "group-event", {
                    "topic": item.topic, "group": self.ledger.group, "member": self._member_id,
                    "partition": item.partition, "event": item.type, "offset_before": item.offset_before,
                    "offset_after": item.offset_after, "detail": item.detail})
            elif isinstance(item, Message):
                self._take(item)
            if not self._settle_due(session):
                return "error"
        return "halt"

    def _wait_s(self) -> float:
        if not self._held:
            return IDLE_WAIT_S
        return min(IDLE_WAIT_S, max(0.0, min(due for due, _ in self._held) - time.monotonic()))

    def _take(self, message: Message) -> None:
        self.ledger.deliver(self.process, self._member_id, message)
        delay_s = self.rng.uniform(0, self.plan.ack_delay_s_max)
        if not self.calm.is_set() and self.rng.random() < self.plan.hold_probability:
            delay_s += self.plan.hold_s  # past the visibility timeout: delivered again meanwhile
        self._held.append((time.monotonic() + delay_s, message))

    def _settle_due(self, session: Session) -> bool:
        """Settle the records whose delay ran out; False if the session cannot settle any more."""
        now = time.monotonic()
        due = [m for t, m in self._held if t <= now]
        if not due:
            return True
        self._held = [(t, m) for t, m in self._held if t > now]
        nack_p = self.plan.nack_probability if self.plan.mode == "queue" and not self.calm.is_set() else 0.0
        nacks: list[Message] = []
        acks: list[Message] = []
        for m in due:
            (nacks if self.rng.random() < nack_p else acks).append(m)
        ok = self._settle(session, "nack", nacks) and self._settle(session, "ack", acks)
        if ok and acks and self.plan.mode == "stream" and self.rng.random() < self.plan.commit_probability:
            ok = self._commit(session, acks)
        return ok

    def _settle(self, session: Session, verb: str, messages: list[Message]) -> bool:
        if not messages:
            return True
        self.history.invoke(self.process, verb, {"topic": self.ledger.topic, "group": self.ledger.group,
                                                 "member": self._member_id,
                                                 "records": [[m.partition, m.offset] for m in messages]})
        try:
            if verb == "ack":
                session.consumer.ack(messages)
            else:
                session.consumer.nack(messages, self.rng.randint(0, self.plan.nack_delay_ms_max))
        except Exception as err:  # unknown outcome: the records are delivered again if unsettled
            self.history.info(self.process, verb, {"error": getattr(err, "code", type(err).__name__),
                                                   "message": str(err)[:300]})
            return False
        self.history.ok(self.process, verb, {"count": len(messages)})
        return True

    def _commit(self, session: Session, acked: list[Message]) -> bool:
        """Stream mode: commit each partition of ``acked`` to just after its highest acked record,
        but never past a record the group was not delivered (the ledger's prefix)."""
        tops: dict[int, int] = {}
        for m in acked:
            tops[m.partition] = max(tops.get(m.partition, 0), m.offset + 1)
        for p, top in sorted(tops.items()):
            offset = min(top, self.ledger.delivered_prefix(p))
            if not self.ledger.begin_commit(self.process, p, offset):
                continue
            try:
                session.consumer.commit(p, offset)
            except Exception as err:
                self.ledger.end_commit(self.process, p, offset, err)
                return False
            self.ledger.end_commit(self.process, p, offset, None)
        return True
