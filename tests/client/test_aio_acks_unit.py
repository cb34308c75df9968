"""The asyncio consumer's ack coalescing (``broker.client.aio.acks``), driven with a scripted send:
who travels together, what each caller gets back, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from broker.client.aio.acks import ACK_POSITIONS_MAX, AckCoalescer, Settleable
from broker.client.aio.routing import call_metadata
from broker.client.errors import Unavailable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Msg:
    def __init__(self, n: int) -> None:
        self.position = b"p%d" % n
        self.settled = False


class Script:
    """A send that records each request and waits until the test lets it answer (or fail)."""

    def __init__(self) -> None:
        self.requests: list[list[bytes]] = []
        self.gates: list[asyncio.Future[Exception | None]] = []

    async def send(self, messages: list[Settleable]) -> None:
        self.requests.append([m.position for m in messages])
        gate: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        error = await gate
        if error is not None:
            raise error
        for m in messages:
            m.settled = True

    async def answer(self, index: int, error: Exception | None = None) -> None:
        while len(self.gates) <= index:
            await asyncio.sleep(0)
        self.gates[index].set_result(error)


async def one_ack_in_flight() -> tuple[Script, AckCoalescer, asyncio.Future[None]]:
    """A coalescer over a scripted send, with the ack of message 0 sent and not answered yet."""
    script = Script()
    acks = AckCoalescer(script.send)
    first = asyncio.ensure_future(acks.ack([Msg(0)]))
    while not script.requests:
        await asyncio.sleep(0)
    return script, acks, first


def test_a_lone_ack_goes_at_once_and_the_ones_that_wait_go_together() -> None:
    async def main() -> None:
        script, acks, first = await one_ack_in_flight()
        later = [asyncio.ensure_future(acks.ack([Msg(n)])) for n in range(1, 6)]
        twice = Msg(6)
        later += [asyncio.ensure_future(acks.ack([twice])), asyncio.ensure_future(acks.ack([twice]))]
        await asyncio.sleep(0)
        assert script.requests == [[b"p0"]] and not first.done()
        await script.answer(0)
        await first
        await script.answer(1)
        await asyncio.gather(*later)
        assert script.requests[1] == [b"p1", b"p2", b"p3", b"p4", b"p5", b"p6"], "one request, no duplicate"
        assert len(script.requests) == 2
        await acks.ack([twice])  # settled already: nothing is sent
        assert len(script.requests) == 2

    asyncio.run(main())


def test_a_failed_request_fails_only_its_callers_and_the_queue_goes_on() -> None:
    async def main() -> None:
        script, acks, first = await one_ack_in_flight()
        second = asyncio.ensure_future(acks.ack([Msg(1)]))
        await asyncio.sleep(0)
        await script.answer(0, Unavailable("UNAVAILABLE", "leader lost"))
        with pytest.raises(Unavailable):
            await first
        await script.answer(1)
        await second
        assert script.requests == [[b"p0"], [b"p1"]]

    asyncio.run(main())


def test_a_caller_cancelled_before_its_request_sends_nothing_and_big_acks_are_split() -> None:
    async def main() -> None:
        script, acks, first = await one_ack_in_flight()
        gone = asyncio.ensure_future(acks.ack([Msg(1)]))
        big = [Msg(n) for n in range(2, 2 + ACK_POSITIONS_MAX)]
        large = asyncio.ensure_future(acks.ack(big))
        small = asyncio.ensure_future(acks.ack([Msg(99_999)]))
        await asyncio.sleep(0)
        gone.cancel()
        await script.answer(0)
        await script.answer(1)
        await script.answer(2)
        await asyncio.gather(first, large, small)
        assert gone.cancelled()
        assert [len(r) for r in script.requests] == [1, ACK_POSITIONS_MAX, 1], "at most the limit per request"
        assert b"p1" not in [p for r in script.requests for p in r]

    asyncio.run(main())


def test_only_calls_with_the_same_metadata_share_a_request() -> None:
    async def main() -> None:
        script = Script()
        acks = AckCoalescer(script.send)

        async def ack_as(who: str, n: int) -> None:
            call_metadata.set((("authorization", f"Bearer {who}"),))  # this task's own context
            await acks.ack([Msg(n)])

        calls = [asyncio.ensure_future(ack_as("alice", 0)), asyncio.ensure_future(ack_as("bob", 1))]
        while len(script.requests) < 2:
            await asyncio.sleep(0)
        await script.answer(0)
        await script.answer(1)
        await asyncio.gather(*calls)
        assert sorted(script.requests) == [[b"p0"], [b"p1"]], "two callers' credentials: two requests"

    asyncio.run(main())
