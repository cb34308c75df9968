"""Concurrent ``publish`` calls to one topic, sent together (both SDKs' default).

Services publish one event per call from many tasks or threads at once (one per request they
serve). Sent one gRPC call each, every record pays a whole call on the client, the leader and
through Raft: about 2 ms of CPU over the processes here, so a few hundred concurrent publishes a
second fill two cores and queue. So, as Kafka's producer does (``linger.ms=0``), the client keeps
**one request in flight per topic**: a ``publish`` that finds the topic's request in flight waits in
the topic's queue, and when the answer comes back everything queued goes as the next request, up to
:data:`MAX_RECORDS` records and :data:`MAX_BYTES` bytes of values, keys and headers. A lone
publisher that waits for each call sees no change: nothing is ever queued behind it.

Each request is one ``publish_batch`` of the client, so it is exactly-once in effect like any
batch (one range of one of the client's producer sessions; retries within the client's retry
deadline resend the same range). What each caller gets:

- **Stored**: its own record's :class:`PublishResult`.
- **Refused as a whole for what may be one record's fault** (INVALID_ARGUMENT, FAILED_PRECONDITION,
  e.g. a schema, ALREADY_EXISTS, e.g. dedup fields, RESOURCE_EXHAUSTED) with a definite outcome: a
  publish is all-or-nothing, so nothing of the request was stored, and each of its records is sent
  again alone, in order; each caller gets its own answer, never a neighbour's error.
- **Any other error**, and any error after an unknown outcome (the request may have been stored,
  e.g. the retry deadline passed during a failover): every caller of the request gets it, as one
  ``publish_batch`` caller would. Such a request is never sent again as single records: new
  session ranges could store its records twice.

A record is checked when it is published (a bad one raises ``InvalidArgument`` at its own call,
before it joins a request). Records with an ``idempotency_key`` (or the sync client's own
``dedup_id``/``msg_id``) are not coalesced: they go at once, one call each (a request mixing
caller keys and session ranges would give every other record a generated key). Both clients take
``coalesce_publishes=False`` to send every ``publish`` as its own call.

This module is the sync client's (:class:`ThreadCoalescer`: the thread whose record heads the
queue sends the request, then hands the queue to the next waiting thread, :class:`HandOff`, which
the sync consumer's ack coalescing in :mod:`broker.client.acks` shares) and the rules both clients
share; :mod:`broker.client.aio.coalescing` is the asyncio client's.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from broker.client import wire
from broker.client.errors import AlreadyExists, BrokerError, FailedPrecondition, InvalidArgument, ResourceExhausted
from broker.client.models import OutgoingRecord, PublishResult, PublishResults

MAX_RECORDS = 1000  # records per coalesced request
MAX_BYTES = 1 << 20  # bytes of values, keys and headers per coalesced request (a larger record goes alone)
# refusals that may be about one record of a request, not about the request's topic or the cluster
_ONE_RECORDS_FAULT = (InvalidArgument, FailedPrecondition, AlreadyExists, ResourceExhausted)

Item = OutgoingRecord | bytes | str


def prepared(record: OutgoingRecord) -> tuple[Item, int]:
    """What a record travels as (its bare value when it has nothing else: packed fastest) and about
    what it adds to a request; raises InvalidArgument for a bad record."""
    plain = (isinstance(record.value, bytes | str) and record.key is None and record.partition is None
             and not record.headers and record.op == "insert")
    if not plain:
        wire.pack_record(record)  # the checks of a publish, before the record joins a request
    size = len(record.value) + (len(record.key) if record.key is not None else 0)
    return (record.value if plain else record), size + sum(len(k) + len(v) for k, v in record.headers.items())


def resend_alone(err: BrokerError, records: int) -> bool:
    """Whether a refused request's records go again one by one (see the module docstring)."""
    return records > 1 and not err.after_unknown_outcome and isinstance(err, _ONE_RECORDS_FAULT)


class Queued(Protocol):
    size: int

    def gone(self) -> bool:
        """True when its caller no longer waits (it is then dropped, not sent)."""
        ...


Q = TypeVar("Q", bound=Queued)


def take(queue: collections.deque[Q]) -> list[Q]:
    """The next request's records from the head of ``queue``: at most MAX_RECORDS, and MAX_BYTES
    unless the first record alone is larger."""
    taken: list[Q] = []
    size = 0
    while queue and len(taken) < MAX_RECORDS:
        head = queue[0]
        if head.gone():
            queue.popleft()
            continue
        if taken and size + head.size > MAX_BYTES:
            break
        taken.append(queue.popleft())
        size += head.size
    return taken


class Slot:
    """One thread's part of a request: answered (``error``, or what a subclass holds) or asked to
    send (``lead``), then ``turn`` is set."""

    __slots__ = ("error", "lead", "turn")

    def __init__(self) -> None:
        self.lead = False
        self.turn = threading.Event()
        self.error: BaseException | None = None

    def gone(self) -> bool:
        return False  # a thread cannot stop waiting

    def answered(self) -> bool:
        """Whether the caller has its answer (subclasses add their result)."""
        return self.error is not None


S = TypeVar("S", bound=Slot)


class HandOff(Generic[S]):
    """Per key a queue of waiting threads, present while one thread is sending for that key; the
    sync client's publish and ack coalescing.

    The thread that finds no queue sends at once; later threads wait. When a request's answer comes
    back its sender answers the callers in it and wakes the thread at the head of the queue, which
    sends the next request (its own part first) and does the same; so no caller waits for more than
    the request ahead of its own and its own. ``take`` picks a request's slots from the head of the
    queue; ``send`` sends them and answers each (an exception it raises is a bug: the callers it
    left unanswered get ``interrupted``)."""

    def __init__(self, take: Callable[[collections.deque[S]], list[S]], send: Callable[[list[S]], None],
                 interrupted: str) -> None:
        self._take = take
        self._send = send
        self._interrupted = interrupted
        self._lock = threading.Lock()
        self._queues: dict[object, collections.deque[S]] = {}

    def waiting(self, key: object) -> int:
        """How many callers of ``key`` wait for a request (tests)."""
        with self._lock:
            queue = self._queues.get(key)
            return len(queue) if queue is not None else 0

    def idle(self) -> bool:
        """No thread is sending for any key (tests: every queue is gone once nobody waits)."""
        with self._lock:
            return not self._queues

    def run(self, key: object, slot: S) -> None:
        """Returns once ``slot`` was answered (sent by this thread or another); raises its error."""
        with self._lock:
            queue = self._queues.get(key)
            slot.lead = queue is None
            if queue is None:
                queue = self._queues[key] = collections.deque()
            queue.append(slot)
        if not slot.lead:
            slot.turn.wait()  # answered, or handed the queue
        if slot.lead:
            self._lead(key, queue)
        if slot.error is not None:
            raise slot.error

    def _lead(self, key: object, queue: collections.deque[S]) -> None:
        taken: list[S] = []
        try:
            with self._lock:
                taken = self._take(queue)
            self._send(taken)
        finally:
            for slot in taken:
                if not slot.answered():  # this thread was interrupted: no caller may wait forever
                    slot.error = RuntimeError(self._interrupted)
                if not slot.lead:
                    slot.turn.set()
            with self._lock:
                if queue:
                    head = queue[0]
                    head.lead = True
                    head.turn.set()
                else:
                    del self._queues[key]


class _Slot(Slot):
    """One thread's record."""

    __slots__ = ("item", "result", "size", "topic")

    def __init__(self, topic: str, item: Item, size: int) -> None:
        super().__init__()
        self.topic = topic
        self.item = item
        self.size = size
        self.result: PublishResult | None = None

    def answered(self) -> bool:
        return self.result is not None or super().answered()


class ThreadCoalescer:
    """The sync client's: per topic a queue of waiting records (:class:`HandOff`), each caller
    returning with its own answer."""

    def __init__(self, send_batch: Callable[[str, Sequence[Item]], PublishResults]) -> None:
        self._send_batch = send_batch
        self.queues: HandOff[_Slot] = HandOff(take, self._send_taken,
                                              "the publishing thread was interrupted before this record's answer")

    def publish(self, topic: str, record: OutgoingRecord) -> PublishResult:
        item, size = prepared(record)
        slot = _Slot(topic, item, size)
        self.queues.run(topic, slot)
        assert slot.result is not None
        return slot.result

    def _send_taken(self, taken: list[_Slot]) -> None:
        self._send(taken[0].topic, taken)

    def _send(self, topic: str, taken: list[_Slot]) -> None:
        try:
            results = self._send_batch(topic, [s.item for s in taken])
        except BrokerError as err:
            if not resend_alone(err, len(taken)):
                for slot in taken:
                    slot.error = err
                return
            for slot in taken:  # nothing was stored: each record alone, so each caller gets its own answer
                self._send(topic, [slot])
            return
        except Exception as err:  # noqa: BLE001 - whatever it is, it is every caller's answer
            for slot in taken:
                slot.error = err
            return
        for slot, result in zip(taken, results, strict=True):
            slot.result = result
