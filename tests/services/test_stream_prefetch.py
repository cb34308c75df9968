"""``StreamRuntime.serve`` with ``read_ahead`` reads a stream's next response while the current one
is being sent (one step ahead, never more); without it (a group's stream: its steps lease what they
deliver) it reads nothing until the caller asks; both close the steps when the caller stops."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator

import pytest

from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.services.streams import StreamRuntime
from broker.storage.memory import MemoryStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


async def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("read_ahead", [True, False])
def test_the_next_step_is_read_while_a_response_is_held_and_no_further(read_ahead: bool) -> None:
    runtime = StreamRuntime(BrokerStateMachine(MemoryStore(), Changes()), read_threads=2)
    started: list[int] = []
    closed = threading.Event()

    def open_steps(is_active: Callable[[], bool]) -> Iterator[object]:
        try:
            for k in range(5):
                started.append(k)
                yield f"response {k}"
        finally:
            closed.set()

    async def consume() -> None:
        stream = runtime.serve(open_steps, read_ahead=read_ahead)
        assert isinstance(stream, AsyncGenerator)
        assert await anext(stream) == "response 0"
        # the caller holds response 0 (as while gRPC sends it): step 1 is read meanwhile, step 2 is not
        ahead = [0, 1] if read_ahead else [0]
        await wait_until(lambda: started == ahead, "the step after the one being sent")
        await asyncio.sleep(0.05)
        assert started == ahead, "at most one step ahead, and none without read_ahead"
        assert await anext(stream) == "response 1"
        await wait_until(lambda: started == [0, 1, 2] if read_ahead else started == [0, 1], "the next step")
        await stream.aclose()

    try:
        asyncio.run(consume())
        assert closed.wait(10), "the steps were closed after the caller stopped"
        assert runtime.open_streams == 0
    finally:
        runtime.stop()
