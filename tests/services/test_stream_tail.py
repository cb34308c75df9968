"""``StreamRuntime.serve`` with ``tail_on_loop``: a stream following the tail runs its steps on the
event loop (after a wait, and after each small response), and goes back to the read pool after a
large response (a catch-up) until it next waits; without it every step runs on the pool."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.packed_reads import PackedBatch
from broker.leader.reading import Idle
from broker.services.streams import TAIL_ON_LOOP_BYTES_MAX, StreamRuntime, small_response
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, common_pb2

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

SMALL = PackedBatch(b"s" * 100, 1)
LARGE = PackedBatch(b"L" * (TAIL_ON_LOOP_BYTES_MAX + 1), 64)


def run_stream(tail_on_loop: Callable[[object], bool] | None) -> list[tuple[str, bool]]:
    """Serve a scripted stream; per step, (what it yielded, whether it ran on the event loop's thread)."""
    state = BrokerStateMachine(MemoryStore(), Changes())
    runtime = StreamRuntime(state, read_threads=2)
    ran: list[tuple[str, bool]] = []
    loop_thread: list[threading.Thread] = []

    def open_steps(is_active: Callable[[], bool]) -> Iterator[object]:
        script = [("large", LARGE), ("idle", None), ("small", SMALL), ("small", SMALL), ("large", LARGE),
                  ("small", SMALL), ("idle", None), ("large", LARGE), ("small", SMALL)]
        for name, step in script:
            ran.append((name, threading.current_thread() is loop_thread[0]))
            yield Idle(state.version, 0.01) if step is None else step  # woken by its timeout

    async def consume() -> None:
        loop_thread.append(threading.current_thread())
        runtime.start(asyncio.get_running_loop())
        received = 0
        async for item in runtime.serve(open_steps, read_ahead=True, tail_on_loop=tail_on_loop):
            assert isinstance(item, PackedBatch)
            received += 1
        assert received == 7

    try:
        asyncio.run(consume())
    finally:
        runtime.stop()
    return ran


def test_a_tailing_stream_runs_its_small_steps_on_the_loop_and_a_catch_up_on_the_pool() -> None:
    assert run_stream(small_response) == [
        ("large", False),  # the first step, as every open, on the pool
        ("idle", False),  # read ahead on the pool while the large response was sent
        ("small", True),  # after the wait: the tail step runs here
        ("small", True),  # after a small response, still here
        ("large", True),
        ("small", False),  # after a large response: back on the pool (a catch-up)
        ("idle", True),  # after a small response, from the pool too: here again
        ("large", True),  # after the wait: here
        ("small", False),
    ]


def test_without_tail_on_loop_every_step_runs_on_the_pool() -> None:
    assert [on_loop for _, on_loop in run_stream(None)] == [False] * 9


def test_what_counts_as_a_small_response() -> None:
    assert small_response(PackedBatch(b"x" * TAIL_ON_LOOP_BYTES_MAX, 10))
    assert not small_response(PackedBatch(b"x" * (TAIL_ON_LOOP_BYTES_MAX + 1), 10))
    assert small_response(broker_pb2.SubscribeResponse(event=common_pb2.Event()))
    assert not small_response(broker_pb2.SubscribeResponse(batch=broker_pb2.RecordBatch()))
    assert not small_response(Idle(0, 1.0))
