"""The change feed (``broker.services.streams.ChangeFeed``): it wakes the event loop after a change
only when a stream waits for one, a waiting stream is always woken, and it holds no thread; and the
listeners of ``broker.leader.changes.Changes`` it is built on."""

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
        state.notify_change()  # the listener runs here, on this thread, before notify returns
    assert loop.wakes == 0 and changes.loop_wakes == 0  # nobody waited: the loop slept through 20 changes

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
    asyncio.run_coroutine_threadsafe(changes.wait(seen, 30.0), loop).result(timeout=5)


def test_the_feed_holds_no_thread_and_stops_listening_when_stopped() -> None:
    state = BrokerStateMachine(MemoryStore(), Changes())
    loop = CountingLoop()
    before = threading.active_count()
    feed = ChangeFeed(state)
    feed.start(loop)
    assert threading.active_count() == before
    feed._changed = loop.create_future()  # a stream waits (the loop need not run for this)
    state.notify_change()
    assert feed.loop_wakes == 1
    feed.stop()
    state.notify_change()
    assert feed.loop_wakes == 1  # stopped: no longer called
    loop.close()


def test_a_failing_listener_neither_breaks_notify_nor_silences_the_others(caplog: pytest.LogCaptureFixture) -> None:
    changes = Changes()
    heard: list[int] = []

    def broken() -> None:
        raise RuntimeError("listener bug")

    def counting() -> None:
        heard.append(changes.version)

    changes.add_listener(broken)
    changes.add_listener(counting)
    changes.notify()
    changes.notify()
    assert heard == [1, 2]  # called after the version moved, every time
    assert "listener bug" in caplog.text
    changes.remove_listener(counting)
    changes.notify()
    assert heard == [1, 2] and changes.version == 3
