"""The asyncio consumer's ack coalescing (``broker.client.aio.acks``), driven with a scripted send:
who travels together, what each caller gets back, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from broker.client.aio.acks import ACK_POSITIONS_MAX, AckCoalescer
from broker.client.aio.routing import call_metadata
from broker.client.errors import InvalidArgument, Unavailable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def pos(n: int) -> list[bytes]:
    return [b"p%d" % n]


class Script:
    """A send that records each request and waits until the test lets it answer (or fail); it
    answers as the leader: a position settled before, or earlier in the same request, is not
    settled again."""

    def __init__(self) -> None:
        self.requests: list[list[bytes]] = []
        self.gates: list[asyncio.Future[Exception | None]] = []
        self.settled: set[bytes] = set()

    async def send(self, positions: list[bytes]) -> list[bool]:
        self.requests.append(positions)
        gate: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        error = await gate
        if error is not None:
            raise error
        answer = []
        for p in positions:
            answer.append(p not in self.settled)
            self.settled.add(p)
        return answer

    async def answer(self, index: int, error: Exception | None = None) -> None:
        while len(self.gates) <= index:
            await asyncio.sleep(0)
        self.gates[index].set_result(error)


async def one_ack_in_flight() -> tuple[Script, AckCoalescer, asyncio.Future[list[bool]]]:
    """A coalescer over a scripted send, with the ack of position 0 sent and not answered yet."""
    script = Script()
    acks = AckCoalescer(script.send)
    first = asyncio.ensure_future(acks.ack(pos(0)))
    while not script.requests:
        await asyncio.sleep(0)
    return script, acks, first


def test_a_lone_ack_goes_at_once_and_the_ones_that_wait_go_together_each_with_its_own_answer() -> None:
    async def main() -> None:
        script, acks, first = await one_ack_in_flight()
        later = [asyncio.ensure_future(acks.ack(pos(n))) for n in range(1, 6)]
        later += [asyncio.ensure_future(acks.ack(pos(6))), asyncio.ensure_future(acks.ack(pos(6) + pos(0)))]
        await asyncio.sleep(0)
        assert script.requests == [[b"p0"]] and not first.done()
        await script.answer(0)
        assert await first == [True]
        await script.answer(1)
        answers = await asyncio.gather(*later)
        assert script.requests[1] == [b"p1", b"p2", b"p3", b"p4", b"p5", b"p6", b"p6", b"p0"], "one request"
        assert answers == [[True]] * 6 + [[False, False]], \
            "p6 twice: the first caller settled it; p0 was settled by the first request"
        assert len(script.requests) == 2
        assert await acks.ack([]) == [] and len(script.requests) == 2, "nothing to ack: nothing is sent"

    asyncio.run(main())


def test_an_invalid_argument_sends_each_caller_alone() -> None:
    async def main() -> None:
        script, acks, first = await one_ack_in_flight()
        shared = [asyncio.ensure_future(acks.ack(pos(n))) for n in (1, 2, 3)]
        await asyncio.sleep(0)
        await script.answer(0)
        await first
        await script.answer(1, InvalidArgument("INVALID_ARGUMENT", "position of partition 9 offset 0 is not a record"))
        await script.answer(2)
        await script.answer(3, InvalidArgument("INVALID_ARGUMENT", "position of partition 9 offset 0 is not a record"))
        await script.answer(4)
        assert await shared[0] == [True] and await shared[2] == [True], "the others' acks went through"
        with pytest.raises(InvalidArgument):
            await shared[1]
        assert script.requests[1:] == [[b"p1", b"p2", b"p3"], [b"p1"], [b"p2"], [b"p3"]]

    asyncio.run(main())


def test_a_failed_request_fails_only_its_callers_and_the_queue_goes_on() -> None:
    async def main() -> None:
        script, acks, first = await one_ack_in_flight()
        second = asyncio.ensure_future(acks.ack(pos(1)))
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
        gone = asyncio.ensure_future(acks.ack(pos(1)))
        big = [b"p%d" % n for n in range(2, 2 + ACK_POSITIONS_MAX)]
        large = asyncio.ensure_future(acks.ack(big))
        small = asyncio.ensure_future(acks.ack(pos(99_999)))
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
            await acks.ack(pos(n))

        calls = [asyncio.ensure_future(ack_as("alice", 0)), asyncio.ensure_future(ack_as("bob", 1))]
        while len(script.requests) < 2:
            await asyncio.sleep(0)
        await script.answer(0)
        await script.answer(1)
        await asyncio.gather(*calls)
        assert sorted(script.requests) == [[b"p0"], [b"p1"]], "two callers' credentials: two requests"

    asyncio.run(main())
