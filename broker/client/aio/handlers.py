"""Handler-style consumption for asyncio: what :meth:`broker.client.aio.AsyncClient.run` does.

The contract of the sync :mod:`broker.client.handlers`: ``ack="auto"``: a handler that returns
acks its message, one that raises nacks it; ``ack="manual"``: the handler settles, and a message it
leaves unsettled is nacked, so nothing is stranded. A settle that fails is logged as the sync
client logs it (``settling N records failed: ...``): the record comes back when its lease runs
out (at-least-once). Handlers run as tasks, ``concurrency`` at a time; in stream mode the messages
of one partition are handled one after another, in order. Every task's outcome is retrieved: an
unexpected error of one ends ``run`` with that error, never an unretrieved task exception.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable

from broker.client.aio.streams import AsyncConsumer, AsyncMessage
from broker.client.errors import BrokerError
from broker.client.models import Event

log = logging.getLogger("broker.client.handlers")  # the sync client's logger: one place to watch

AsyncHandler = Callable[[AsyncMessage], Awaitable[object]]


class HandlerRun:
    """One ``run``: feeds a consumer's messages to handler tasks and settles them."""

    def __init__(self, handler: AsyncHandler, *, manual: bool, concurrency: int, in_order: bool,
                 on_event: Callable[[Event], None]) -> None:
        assert concurrency >= 1
        self._handler, self._manual, self._in_order, self._on_event = handler, manual, in_order, on_event
        self._slots = asyncio.Semaphore(concurrency)
        self._turns: dict[int, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures: list[BaseException] = []
        self.handled = 0

    async def run(self, consumer: AsyncConsumer, limit: int | None) -> int:
        """Handle ``consumer``'s messages until it ends or ``limit`` were dispatched; returns how
        many were handled. Closes the consumer; no handler task is left running when it returns."""
        try:
            async with consumer:
                dispatched = 0
                async for item in consumer:
                    self._raise_failure()
                    if not isinstance(item, AsyncMessage):
                        self._on_event(item)  # a handler sees messages: the group's events go here
                        continue
                    await self._slots.acquire()
                    task = asyncio.get_running_loop().create_task(self._handle(item))
                    self._tasks.add(task)
                    task.add_done_callback(self._finished)
                    dispatched += 1
                    if limit is not None and dispatched >= limit:
                        break
                if self._tasks:
                    await asyncio.wait(set(self._tasks))
                self._raise_failure()
        finally:
            # Cancelled, or the stream failed: the handlers still running stop with it (their records'
            # leases run out and they are delivered again); none is left running after run() returns.
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        return self.handled

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved here, raised by run()
            self._failures.append(task.exception())  # type: ignore[arg-type]

    def _raise_failure(self) -> None:
        if self._failures:
            raise self._failures[0]

    async def _handle(self, message: AsyncMessage) -> None:
        turn = self._turns[message.partition] if self._in_order else contextlib.nullcontext()
        verb = "ack"
        try:
            try:
                async with turn:  # tasks start in creation order, and asyncio locks are fair
                    await self._handler(message)
            except Exception:  # noqa: BLE001 - a failing handler nacks its message
                log.debug("handler failed on %s/%s@%s", message.topic, message.partition, message.offset,
                          exc_info=True)
                verb = "nack"
            if self._manual and not message.settled:
                verb = "nack"  # manual: a handler that leaves its message unsettled nacks it
            if not message.settled:
                try:
                    await (message.ack() if verb == "ack" else message.nack())
                except BrokerError as err:  # the lease runs out and the record comes back: at-least-once
                    log.warning("settling %d records failed: %s", 1, err)
        finally:
            self._slots.release()
        self.handled += 1
