"""The asyncio consumer's ack coalescing: concurrent ``ack`` calls of one consumer share ``Ack``
requests, one request in flight per consumer and call metadata.

An ``Ack`` costs the leader a round of Raft whatever it carries (one replicated command), so a
consumer that acks each message from many tasks (``AsyncClient.run`` with ``concurrency`` > 1) was
held to about one round trip's worth of acks per task. Here an ack that finds a request in flight
waits for it to finish and then goes with every other ack that arrived meanwhile, up to
:data:`ACK_POSITIONS_MAX` positions per request. A lone ack is sent at once, as before.

Each caller still returns only once a request carrying its messages was answered, and raises what
that request raised (its messages are then not settled: their leases run out and they come back,
at-least-once, as after a lone ack that failed). A caller cancelled before its messages were taken
into a request sends nothing; cancelled after, its messages may be settled. Only calls made with
the same ``call_metadata`` (one caller's credentials) share requests, as for publish coalescing.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from broker.client.aio.coalescing import drain_queued
from broker.client.aio.routing import Metadata, metadata

ACK_POSITIONS_MAX = 1000  # positions per shared request (the leader takes up to 10,000 per call)


class Settleable(Protocol):
    """A leased message (``AsyncMessage``): its position token, and whether it is settled."""

    settled: bool

    @property
    def position(self) -> bytes: ...


class _Waiting:
    __slots__ = ("messages", "done")

    def __init__(self, messages: list[Settleable], done: asyncio.Future[None]) -> None:
        self.messages = messages
        self.done = done


class AckCoalescer:
    """Queues of waiting acks, per call metadata, each drained by one task that calls ``send`` with
    the messages of one request at a time (``send`` marks them settled when it succeeds)."""

    def __init__(self, send: Callable[[list[Settleable]], Awaitable[None]]) -> None:
        self._send = send
        self._queues: dict[Metadata, collections.deque[_Waiting]] = {}
        self._senders: dict[Metadata, asyncio.Task[None]] = {}

    async def ack(self, messages: Sequence[Settleable]) -> None:
        pending = [m for m in messages if not m.settled]
        if not pending:
            return
        key = metadata() or ()
        loop = asyncio.get_running_loop()
        waiting = _Waiting(pending, loop.create_future())
        self._queues.setdefault(key, collections.deque()).append(waiting)
        if key not in self._senders:
            self._senders[key] = loop.create_task(self._send_queued(key))
        await waiting.done

    async def _send_queued(self, key: Metadata) -> None:
        try:
            await drain_queued(self._queues[key], _take, self._send_taken, lambda w: w.done,
                               "the consumer stopped sending its queued acks")
        finally:
            del self._senders[key]
            del self._queues[key]

    async def _send_taken(self, taken: list[_Waiting]) -> None:
        unique = {m.position: m for w in taken for m in w.messages if not m.settled}
        try:
            if unique:
                await self._send(list(unique.values()))
        except Exception as exc:  # this request's callers raise it; the queue goes on
            _answer(taken, exc)
            return
        except BaseException:  # this task was cancelled mid-request
            _answer(taken, RuntimeError("the consumer stopped sending its acks; they may or may not be settled"))
            raise
        _answer(taken, None)


def _answer(taken: list[_Waiting], error: Exception | None) -> None:
    for waiting in taken:
        if waiting.done.done():
            continue
        if error is None:
            waiting.done.set_result(None)
        else:
            waiting.done.set_exception(error)


def _take(queue: collections.deque[_Waiting]) -> list[_Waiting]:
    """The next request's callers: the first one still waiting, and those after it while they fit."""
    taken: list[_Waiting] = []
    size = 0
    while queue and (not taken or size + len(queue[0].messages) <= ACK_POSITIONS_MAX):
        waiting = queue.popleft()
        if waiting.done.done():  # cancelled before it was taken: sends nothing
            continue
        taken.append(waiting)
        size += len(waiting.messages)
    return taken
