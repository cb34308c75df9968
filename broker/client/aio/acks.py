"""The asyncio consumer's ack coalescing: concurrent ``ack`` calls of one consumer share ``Ack``
requests, one request in flight per consumer and call metadata.

An ``Ack`` costs the leader a round of Raft whatever it carries (one replicated command), so a
consumer that acks each message from many tasks (``AsyncClient.run`` with ``concurrency`` > 1) was
held to about one round trip's worth of acks per task. Here an ack that finds a request in flight
waits for it to finish and then goes with every other ack that arrived meanwhile, up to
:data:`ACK_POSITIONS_MAX` positions per request (a larger ack goes alone). A lone ack is sent at
once, as before.

Each caller still returns only once a request carrying its positions was answered, with its own
answer: per position, whether that request settled it (``AckResponse.not_settled``; see
:mod:`broker.client.acks`, the sync consumer's, for a server without it). A request refused with
INVALID_ARGUMENT and a definite outcome (nothing settled; maybe one caller's bad position) sends
each caller's positions again alone, so each gets its own answer; any other error is raised to
every caller of the request (its messages are then not settled: their leases run out and they come
back, at-least-once, as after a lone ack that failed). A caller cancelled before its positions
were taken into a request sends nothing; cancelled after, its messages may be settled. Only calls
made with the same ``call_metadata`` (one caller's credentials) share requests, as for publish
coalescing.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

from broker.client.acks import ACK_POSITIONS_MAX, resend_alone, split
from broker.client.aio.coalescing import drain_queued
from broker.client.aio.routing import Metadata, metadata
from broker.client.errors import BrokerError

__all__ = ["ACK_POSITIONS_MAX", "AckCoalescer"]


class _Waiting:
    __slots__ = ("done", "positions")

    def __init__(self, positions: list[bytes], done: asyncio.Future[list[bool]]) -> None:
        self.positions = positions
        self.done = done


class AckCoalescer:
    """Queues of waiting acks, per call metadata, each drained by one task that calls ``send`` with
    the positions of one request at a time (``send`` answers per position whether it settled it)."""

    def __init__(self, send: Callable[[list[bytes]], Awaitable[list[bool]]]) -> None:
        self._send = send
        self._queues: dict[Metadata, collections.deque[_Waiting]] = {}
        self._senders: dict[Metadata, asyncio.Task[None]] = {}

    async def ack(self, positions: list[bytes]) -> list[bool]:
        """Per position, whether the request that carried it settled its record."""
        if not positions:
            return []
        key = metadata() or ()
        loop = asyncio.get_running_loop()
        waiting = _Waiting(positions, loop.create_future())
        self._queues.setdefault(key, collections.deque()).append(waiting)
        if key not in self._senders:
            self._senders[key] = loop.create_task(self._send_queued(key))
        return await waiting.done

    async def _send_queued(self, key: Metadata) -> None:
        try:
            await drain_queued(self._queues[key], _take, self._send_taken, lambda w: w.done,
                               "the consumer stopped sending its queued acks")
        finally:
            del self._senders[key]
            del self._queues[key]

    async def _send_taken(self, taken: list[_Waiting]) -> None:
        try:
            settled = await self._send([p for w in taken for p in w.positions])
        except Exception as exc:  # this request's callers raise it; the queue goes on
            if isinstance(exc, BrokerError) and resend_alone(exc, len(taken)):
                for waiting in taken:  # nothing was settled: each caller's positions alone, its own answer
                    await self._send_taken([waiting])
                return
            _fail(taken, exc)
            return
        except BaseException:  # this task was cancelled mid-request
            _fail(taken, RuntimeError("the consumer stopped sending its acks; they may or may not be settled"))
            raise
        for waiting, answer in zip(taken, split(settled, [len(w.positions) for w in taken]), strict=True):
            if not waiting.done.done():
                waiting.done.set_result(answer)


def _fail(taken: list[_Waiting], error: Exception) -> None:
    for waiting in taken:
        if not waiting.done.done():
            waiting.done.set_exception(error)


def _take(queue: collections.deque[_Waiting]) -> list[_Waiting]:
    """The next request's callers: the first one still waiting, and those after it while they fit."""
    taken: list[_Waiting] = []
    size = 0
    while queue and (not taken or size + len(queue[0].positions) <= ACK_POSITIONS_MAX):
        waiting = queue.popleft()
        if waiting.done.done():  # cancelled before it was taken: sends nothing
            continue
        taken.append(waiting)
        size += len(waiting.positions)
    return taken
