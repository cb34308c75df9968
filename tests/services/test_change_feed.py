"""The change feed (``broker.services.streams.ChangeFeed``): it wakes the event loop after a change
only when a stream waits for one, and a waiting stream is always woken."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import Context
from typing import TypeVarTuple, Unpack

import pytest

from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.services.streams import ChangeFeed
from broker.storage.memory import MemoryStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
Ts = TypeVarTuple("Ts")


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the wake-ups other threads ask of it."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes = 0

    def call_soon_threadsafe(self, callback: Callable[[Unpack[Ts]], object], *args: *Ts,
                             context: Context | None = None) -> asyncio.Handle:
        self.wakes += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


@pytest.fixture
def feed() -> Iterator[tuple[ChangeFeed, BrokerStateMachine, CountingLoop]]:
    state = BrokerStateMachine(MemoryStore(), Changes())
    loop = CountingLoop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    feed = ChangeFeed(state)
    feed.start(loop)
    yield feed, state, loop
    feed.stop()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_changes_wake_the_loop_only_when_a_stream_waits(
        feed: tuple[ChangeFeed, BrokerStateMachine, CountingLoop]) -> None:
    changes, state, loop = feed
    for _ in range(20):
        state.notify_change()
        time.sleep(0.002)  # not a wait for state: lets the pump thread run between changes
    wait_until(lambda: changes.pumped_version == state.version, "the pump to see every change")
    assert loop.wakes == 0  # nobody waited: the event loop slept through 20 changes

    seen = state.version
    waiting = asyncio.run_coroutine_threadsafe(changes.wait(seen, 30.0), loop)
    wait_until(lambda: changes._changed is not None, "the stream to wait")
    state.notify_change()
    waiting.result(timeout=10)  # woken by the change, long before its own 30 s timeout
    assert loop.wakes >= 1


def test_a_change_between_arming_and_reading_the_version_is_not_missed(
        feed: tuple[ChangeFeed, BrokerStateMachine, CountingLoop]) -> None:
    """A stream that saw version v and waits after the version moved on returns at once."""
    changes, state, loop = feed
    seen = state.version
    state.notify_change()
    wait_until(lambda: changes.pumped_version == state.version, "the pump to see the change")
    asyncio.run_coroutine_threadsafe(changes.wait(seen, 30.0), loop).result(timeout=5)
