"""``AsyncClient.run`` over a scripted consumer: settle failures are handled as the sync client
handles them (a logged warning, never an unretrieved task exception), ``ack="manual"`` and the sync
``on_event(event)`` work as in the sync SDK."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broker.client import BrokerError, Event, Unavailable
from broker.client.aio import AsyncClient, AsyncMessage
from broker.v1 import common_pb2

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class ScriptedConsumer:
    """What ``AsyncClient.consumer`` returns, delivering scripted items; ``fail_settles``: every
    ack and nack raises it (as a lost leader would, after the retries)."""

    def __init__(self, count: int, events: int = 0, fail_settles: BrokerError | None = None) -> None:
        self.items: list[object] = [Event("skip_forward", "t", 0, 0, 3) for _ in range(events)]
        self.items += [AsyncMessage(self, common_pb2.Record(topic="t", partition=i % 2, offset=i,  # type: ignore[arg-type]
                                                            value=b"v%d" % i, position=b"p%d" % i))
                       for i in range(count)]
        self.fail_settles = fail_settles
        self.acked: list[int] = []
        self.nacked: list[int] = []
        self.closed = False

    async def __aenter__(self) -> ScriptedConsumer:
        return self

    async def stream_mode(self) -> bool:
        return False

    async def close(self) -> None:
        self.closed = True

    async def __aexit__(self, *exc: object) -> None:
        self.closed = True

    def __aiter__(self) -> AsyncIterator[object]:
        return self._items()

    async def _items(self) -> AsyncIterator[object]:
        for item in self.items:
            await asyncio.sleep(0)
            yield item

    async def _settle(self, messages: list[AsyncMessage], into: list[int]) -> None:
        await asyncio.sleep(0)
        if self.fail_settles is not None:
            raise self.fail_settles
        for m in messages:
            m.settled = True
            into.append(m.offset)

    async def ack(self, messages: list[AsyncMessage]) -> int:
        await self._settle(messages, self.acked)
        return len(messages)

    async def nack(self, messages: list[AsyncMessage], delay_ms: int | None = None) -> None:
        await self._settle(messages, self.nacked)


def run_with(consumer: ScriptedConsumer, handler: Any, **kwargs: Any) -> tuple[int, list[dict[str, Any]]]:
    """``AsyncClient.run`` over ``consumer``; returns its count and what reached the loop's
    exception handler (an unretrieved task exception does, when the task is collected)."""
    unhandled: list[dict[str, Any]] = []

    async def main() -> int:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))
        async with AsyncClient(["127.0.0.1:1"]) as c:
            c.consumer = lambda *a, **k: consumer  # type: ignore[assignment,method-assign]
            handled = await c.run("t", group="g", handler=handler, **kwargs)
            await asyncio.sleep(0.05)
            gc.collect()
            await asyncio.sleep(0)
            return handled

    return asyncio.run(main()), unhandled


def test_a_failing_settle_is_a_logged_warning_as_in_the_sync_client(caplog: pytest.LogCaptureFixture) -> None:
    consumer = ScriptedConsumer(6, fail_settles=Unavailable("UNAVAILABLE", "no leader answered"))

    async def handler(message: AsyncMessage) -> None:
        if message.offset % 3 == 0:
            raise ValueError("a failing handler nacks")

    with caplog.at_level(logging.WARNING, logger="broker.client.handlers"):
        handled, unhandled = run_with(consumer, handler, concurrency=3)
    warned = [r.getMessage() for r in caplog.records if "settling" in r.getMessage()]
    assert handled == 6
    assert len(warned) == 6 and all("settling 1 records failed: no leader answered" in w for w in warned)
    assert not unhandled, "no task exception was left unretrieved"
    assert consumer.closed


def test_manual_handlers_settle_themselves_and_what_they_leave_is_nacked() -> None:
    consumer = ScriptedConsumer(6)

    async def handler(message: AsyncMessage) -> None:
        if message.offset < 3:
            await message.ack()  # its own settle: run sends nothing more for it

    handled, unhandled = run_with(consumer, handler, ack="manual", batch_size=10, concurrency=2)
    assert handled == 6 and not unhandled
    assert sorted(consumer.acked) == [0, 1, 2] and sorted(consumer.nacked) == [3, 4, 5]


def test_on_event_takes_the_groups_events_as_the_sync_run_does() -> None:
    consumer = ScriptedConsumer(2, events=2)
    events: list[Event] = []

    async def handler(message: AsyncMessage) -> None:
        pass

    handled, _ = run_with(consumer, handler, on_event=events.append)
    assert handled == 2 and [e.type for e in events] == ["skip_forward", "skip_forward"]
    assert sorted(consumer.acked) == [0, 1]


def test_an_unexpected_settle_error_ends_run_with_it() -> None:
    consumer = ScriptedConsumer(4)

    async def broken_ack(messages: list[AsyncMessage]) -> int:
        raise RuntimeError("a bug in settling")

    consumer.ack = broken_ack  # type: ignore[method-assign]

    async def handler(message: AsyncMessage) -> None:
        pass

    with pytest.raises(RuntimeError, match="a bug in settling"):
        run_with(consumer, handler)
