"""The consumer-group ticker's cadence: idle without runtimes, every ``tick_s`` with them (unit: real
core over MemoryStore and InMemoryReplicator; the ticker thread runs for real)."""

from __future__ import annotations

import threading

import pytest

from broker.leader.groups.service import IDLE_TICK_S
from tests.core.groups_env import make_env
from tests.replication.cluster import wait_until

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class _Waits:
    """Records each of the ticker's waits on its wake-up event: (timeout, result; None while waiting)."""

    def __init__(self, event: threading.Event) -> None:
        self.entries: list[tuple[float, bool | None]] = []
        self._stock = event.wait
        event.wait = self.wait  # type: ignore[method-assign]

    def wait(self, timeout: float | None = None) -> bool:
        at = len(self.entries)
        self.entries.append((-1.0 if timeout is None else timeout, None))
        result = self._stock(timeout)
        self.entries[at] = (self.entries[at][0], result)
        return result

    def waiting_idle(self) -> bool:
        return bool(self.entries) and self.entries[-1] == (IDLE_TICK_S, None)


def test_the_ticker_idles_without_runtimes_and_a_new_runtime_wakes_it() -> None:
    """A node that holds no group runtime (a follower, or a leader no consumer has used) has nothing to
    expire: its ticker waits IDLE_TICK_S (it woke every 50 ms before). Creating a runtime wakes it at
    once (the wait returns True: woken, not timed out), and it then ticks every ``tick_s`` to expire
    leases. Observed through the ticker's own waits, not timed."""
    env = make_env()
    env.topic("t")
    service = env.service
    waits = _Waits(service._work)
    service.start()
    try:
        wait_until(waits.waiting_idle, 10, "the ticker waiting idle")
        assert all(timeout == IDLE_TICK_S for timeout, _ in waits.entries), waits.entries
        idle = len(waits.entries)
        env.group("t", "g")  # a runtime: leases to expire from now on
        wait_until(lambda: len(waits.entries) > idle + 1, 10, "the ticker waiting again")
        assert waits.entries[idle - 1] == (IDLE_TICK_S, True), "the new runtime did not wake the ticker"
        assert waits.entries[idle][0] == service._tick_s < IDLE_TICK_S
    finally:
        service.stop()


def test_stop_ends_an_idle_wait_at_once() -> None:
    env = make_env()
    service = env.service
    waits = _Waits(service._work)
    service.start()
    wait_until(waits.waiting_idle, 10, "the ticker waiting idle")
    service.stop()
    assert service._thread is not None and not service._thread.is_alive()
    assert waits.entries[-1] == (IDLE_TICK_S, True), "stop did not wake the ticker"
