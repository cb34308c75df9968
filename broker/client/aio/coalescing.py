"""Concurrent ``AsyncClient.publish`` calls to one topic, sent together (the asyncio SDK's default).

Services publish one event per call from many tasks at once (one per request they serve). Sent one
gRPC call each, every record pays a whole call on the client, the leader and through Raft: about
2 ms of CPU over the processes here, so a few hundred concurrent publishes a second fill two cores
and queue. So, as Kafka's producer does (``linger.ms=0``), the client keeps **one request in flight
per topic**: a ``publish`` that finds the topic's request in flight waits in the topic's queue, and
when the answer comes back everything queued goes as the next request, up to
:data:`MAX_RECORDS` records and :data:`MAX_BYTES` bytes of values, keys and headers. A lone
publisher that awaits each call sees no change: nothing is ever queued behind it.

Each request is one ``publish_batch`` of the client, so it is exactly-once in effect like any
batch (one range of one of the client's producer sessions; retries within the client's retry
deadline resend the same range), counts against ``max_in_flight_batches``, and reports "published"
to ``on_event`` once for the whole request. What each caller gets:

- **Stored**: its own record's :class:`PublishResult`.
- **Refused as a whole for what may be one record's fault** (INVALID_ARGUMENT, FAILED_PRECONDITION,
  e.g. a schema, ALREADY_EXISTS, e.g. dedup fields, RESOURCE_EXHAUSTED) with a definite outcome: a
  publish is all-or-nothing, so nothing of the request was stored, and each of its records is sent
  again alone, in order; each caller gets its own answer, never a neighbour's error.
- **Any other error**, and any error after an unknown outcome (the request may have been stored,
  e.g. the retry deadline passed during a failover): every caller of the request gets it, as one
  ``publish_batch`` caller would. Such a request is never sent again as single records: new
  session ranges could store its records twice.
- **Cancelled** before its record was taken into a request: the record is not sent. Cancelled
  after: the record may be stored (as with a cancelled ``publish_batch``).

Records with an ``idempotency_key`` are not coalesced: they go at once, one call each, as before
(a request mixing caller keys and session ranges would give every other record a generated key).
``AsyncClient(coalesce_publishes=False)`` sends every ``publish`` as its own call.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from broker.client import wire
from broker.client.errors import AlreadyExists, BrokerError, FailedPrecondition, InvalidArgument, ResourceExhausted
from broker.client.models import OutgoingRecord, PublishResult, PublishResults

MAX_RECORDS = 1000  # records per coalesced request
MAX_BYTES = 1 << 20  # bytes of values, keys and headers per coalesced request (a larger record goes alone)
# refusals that may be about one record of a request, not about the request's topic or the cluster
_ONE_RECORDS_FAULT = (InvalidArgument, FailedPrecondition, AlreadyExists, ResourceExhausted)

Item = OutgoingRecord | bytes | str
SendBatch = Callable[[str, Sequence[Item]], Awaitable[PublishResults]]


def record_bytes(record: OutgoingRecord) -> int:
    """About what a record adds to a request (value, key and headers)."""
    size = len(record.value) + (len(record.key) if record.key is not None else 0)
    return size + sum(len(k) + len(v) for k, v in record.headers.items())


@dataclass
class _Waiting:
    item: Item  # the bare value when the record has nothing else (the SDK packs those fastest)
    size: int
    result: asyncio.Future[PublishResult]


class PublishCoalescer:
    """Per topic: a queue of waiting records and at most one task sending them (see the module)."""

    def __init__(self, send_batch: SendBatch) -> None:
        self._send_batch = send_batch
        self._queues: dict[str, collections.deque[_Waiting]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}

    async def publish(self, topic: str, record: OutgoingRecord) -> PublishResult:
        plain = (isinstance(record.value, bytes | str) and record.key is None and record.partition is None
                 and not record.headers and record.op == "insert")
        if not plain:
            wire.pack_record(record)  # a bad record raises InvalidArgument here, before it joins a request
        waiting = _Waiting(record.value if plain else record, record_bytes(record),
                           asyncio.get_running_loop().create_future())
        self._queues.setdefault(topic, collections.deque()).append(waiting)
        if topic not in self._senders:
            self._senders[topic] = asyncio.get_running_loop().create_task(self._send_queued(topic))
        return await waiting.result

    async def drain(self) -> None:
        """Wait until every record queued so far has its answer."""
        while self._senders:
            await asyncio.gather(*self._senders.values(), return_exceptions=True)

    async def _send_queued(self, topic: str) -> None:
        queue = self._queues[topic]
        try:
            while queue:
                taken = self._take(queue)
                if taken:
                    await self._send(topic, taken)
                    # let the callers just answered return before the next request is built and sent:
                    # measured, their await otherwise ends that much later (disk-1 ack p50 3.2 -> 1.9 ms)
                    await asyncio.sleep(0)
        finally:
            del self._senders[topic]
            if queue:  # only when this task itself was cancelled: fail what it leaves behind
                error = RuntimeError("the client stopped sending this topic's queued publishes")
                for waiting in queue:
                    if not waiting.result.done():
                        waiting.result.set_exception(error)
                queue.clear()
            del self._queues[topic]

    @staticmethod
    def _take(queue: collections.deque[_Waiting]) -> list[_Waiting]:
        taken: list[_Waiting] = []
        size = 0
        while queue and len(taken) < MAX_RECORDS:
            waiting = queue[0]
            if waiting.result.cancelled():  # its caller gave up before it was sent: it is not sent
                queue.popleft()
                continue
            if taken and size + waiting.size > MAX_BYTES:
                break
            taken.append(queue.popleft())
            size += waiting.size
        return taken

    async def _send(self, topic: str, taken: list[_Waiting]) -> None:
        try:
            results = await self._send_batch(topic, [w.item for w in taken])
        except BrokerError as err:
            if len(taken) == 1 or err.after_unknown_outcome or not isinstance(err, _ONE_RECORDS_FAULT):
                _fail(taken, err)
                return
            for waiting in taken:  # nothing was stored: each record alone, so each caller gets its own answer
                if not waiting.result.cancelled():
                    await self._send(topic, [waiting])
            return
        except BaseException as err:  # cancelled, or a bug: no caller may wait forever
            _fail(taken, err if isinstance(err, Exception) else RuntimeError(f"publish interrupted ({err!r})"))
            raise
        for waiting, result in zip(taken, results, strict=True):
            if not waiting.result.done():
                waiting.result.set_result(result)


def _fail(taken: list[_Waiting], err: Exception) -> None:
    for waiting in taken:
        if not waiting.result.done():
            waiting.result.set_exception(err)
