"""The asyncio SDK's publish coalescing (:mod:`broker.client.aio.coalescing`), on a scripted send.

The coalescer's one dependency is the client's ``publish_batch``; here a recording function stands
in for it, so each rule can be driven exactly (which records travel together, what a refusal or an
unknown outcome does to each caller). ``tests/client/test_aio_coalescing_cluster.py`` drives the
same through a real cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from broker.client.aio.coalescing import PublishCoalescer
from broker.client.aio.routing import call_metadata
from broker.client.coalescing import MAX_BYTES, MAX_RECORDS, Item
from broker.client.errors import InvalidArgument, Unavailable
from broker.client.models import OutgoingRecord, PublishResult, PublishResults

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Broker:
    """Records each request; answers it after ``release`` (when ``hold``), or refuses it by ``refuse``."""

    def __init__(self) -> None:
        self.requests: list[list[bytes]] = []
        self.stored: list[bytes] = []
        self.hold = False
        self.gate = asyncio.Event()
        self.refuse: dict[bytes, Exception] = {}  # a record -> the error of any request holding it
        self.fail_all: Exception | None = None

    async def send(self, topic: str, items: Sequence[Item]) -> PublishResults:
        raw = [i.value if isinstance(i, OutgoingRecord) else i for i in items]
        values = [v.encode() if isinstance(v, str) else v for v in raw]
        self.requests.append(values)
        if self.hold:
            await self.gate.wait()
            self.gate.clear()
        if self.fail_all is not None:
            raise self.fail_all
        for value in values:
            if value in self.refuse:
                raise self.refuse[value]
        first = len(self.stored)
        self.stored += values
        return PublishResults(len(values), lambda: [PublishResult(0, first + k, False, 0) for k in range(len(values))])


async def _held(value: bytes = b"a") -> tuple[Broker, PublishCoalescer, asyncio.Task[PublishResult]]:
    """A coalescer whose first publish (of ``value``) is in flight, held until ``broker.gate`` is set."""
    broker = Broker()
    broker.hold = True
    co = PublishCoalescer(broker.send)
    first = asyncio.create_task(co.publish("t", OutgoingRecord(value)))
    await _until(lambda: len(broker.requests) == 1)
    return broker, co, first


async def _until(check: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def test_calls_made_while_a_request_is_in_flight_go_together_in_call_order() -> None:
    async def main() -> None:
        broker, co, first = await _held()
        rest = [asyncio.create_task(co.publish("t", OutgoingRecord(f"r{i}".encode()))) for i in range(5)]
        await asyncio.sleep(0.01)
        assert len(broker.requests) == 1, "nothing more is sent while the topic's request is in flight"
        broker.gate.set()
        assert (await first).offset == 0
        await _until(lambda: len(broker.requests) == 2)
        broker.gate.set()
        results = await asyncio.gather(*rest)
        assert broker.requests == [[b"a"], [b"r0", b"r1", b"r2", b"r3", b"r4"]]
        assert [r.offset for r in results] == [1, 2, 3, 4, 5], "each caller gets its own record's place"
        # another topic does not wait behind this one's request
        broker.hold = False
        assert (await co.publish("u", OutgoingRecord(b"x"))).offset == 6

    asyncio.run(main())


def test_a_request_holds_at_most_max_records_and_about_max_bytes() -> None:
    async def main() -> None:
        broker = Broker()
        co = PublishCoalescer(broker.send)
        small = [co.publish("t", OutgoingRecord(b"%d" % i)) for i in range(MAX_RECORDS + 10)]
        await asyncio.gather(*small)
        assert [len(r) for r in broker.requests] == [MAX_RECORDS, 10]
        broker.requests.clear()
        big = b"x" * (MAX_BYTES // 3 + 1)
        await asyncio.gather(*(co.publish("t", OutgoingRecord(big + b"%d" % i)) for i in range(5)))
        assert [len(r) for r in broker.requests] == [2, 2, 1]
        huge = b"y" * (MAX_BYTES + 1)
        await co.publish("t", OutgoingRecord(huge))  # larger than the bound: it goes alone
        assert broker.requests[-1] == [huge]

    asyncio.run(main())


def test_a_refused_request_is_sent_again_record_by_record_so_only_the_bad_one_fails() -> None:
    async def main() -> None:
        broker = Broker()
        broker.refuse[b"bad"] = InvalidArgument("INVALID_ARGUMENT", "record 2: not what the schema allows")
        co = PublishCoalescer(broker.send)
        outcomes = await asyncio.gather(*(co.publish("t", OutgoingRecord(v)) for v in (b"a", b"b", b"bad", b"c")),
                                        return_exceptions=True)
        assert isinstance(outcomes[2], InvalidArgument)
        assert [o.offset for i, o in enumerate(outcomes) if i != 2] == [0, 1, 2]  # type: ignore[union-attr]
        assert broker.stored == [b"a", b"b", b"c"]
        assert broker.requests == [[b"a", b"b", b"bad", b"c"], [b"a"], [b"b"], [b"bad"], [b"c"]]

    asyncio.run(main())


def test_after_an_unknown_outcome_every_caller_gets_the_error_and_nothing_is_sent_again() -> None:
    async def main() -> None:
        broker = Broker()
        broker.fail_all = InvalidArgument("INVALID_ARGUMENT", "refused", after_unknown_outcome=True)
        co = PublishCoalescer(broker.send)
        outcomes = await asyncio.gather(*(co.publish("t", OutgoingRecord(v)) for v in (b"a", b"b", b"c")),
                                        return_exceptions=True)
        assert all(o is broker.fail_all for o in outcomes)
        assert broker.requests == [[b"a", b"b", b"c"]], "a resend under new session ranges could store twice"

    asyncio.run(main())


def test_an_error_about_the_cluster_reaches_every_caller_without_a_resend() -> None:
    async def main() -> None:
        broker = Broker()
        broker.fail_all = Unavailable("UNAVAILABLE", "no leader within the retry deadline")
        co = PublishCoalescer(broker.send)
        outcomes = await asyncio.gather(*(co.publish("t", OutgoingRecord(v)) for v in (b"a", b"b")),
                                        return_exceptions=True)
        assert all(o is broker.fail_all for o in outcomes) and len(broker.requests) == 1
        broker.fail_all = None
        assert (await co.publish("t", OutgoingRecord(b"c"))).offset == 0, "the topic's queue works on"

    asyncio.run(main())


def test_a_call_cancelled_before_its_record_is_taken_sends_nothing() -> None:
    async def main() -> None:
        broker, co, first = await _held()
        gone = asyncio.create_task(co.publish("t", OutgoingRecord(b"gone")))
        kept = asyncio.create_task(co.publish("t", OutgoingRecord(b"kept")))
        await asyncio.sleep(0.01)
        gone.cancel()
        broker.hold = False
        broker.gate.set()
        await asyncio.gather(first, kept)
        assert broker.requests == [[b"a"], [b"kept"]] and gone.cancelled()
        await co.drain()

    asyncio.run(main())


def test_a_bad_record_is_refused_at_the_call_before_it_joins_a_request() -> None:
    async def main() -> None:
        broker = Broker()
        co = PublishCoalescer(broker.send)
        with pytest.raises(InvalidArgument, match="op"):
            await co.publish("t", OutgoingRecord(b"v", op="explode"))
        with pytest.raises(InvalidArgument):
            await co.publish("t", OutgoingRecord(12345, key="k"))  # type: ignore[arg-type]
        assert broker.requests == []

    asyncio.run(main())


def test_drain_waits_for_the_answers_of_queued_calls() -> None:
    async def main() -> None:
        broker = Broker()
        broker.hold = True
        co = PublishCoalescer(broker.send)
        calls = [asyncio.create_task(co.publish("t", OutgoingRecord(b"%d" % i))) for i in range(3)]
        await _until(lambda: len(broker.requests) == 1)
        drained = asyncio.create_task(co.drain())
        await asyncio.sleep(0.01)
        assert not drained.done()
        broker.hold = False
        broker.gate.set()
        await drained
        assert all(c.done() for c in calls) and len(broker.stored) == 3

    asyncio.run(main())


def test_calls_with_different_call_metadata_never_share_a_request() -> None:
    """Each request carries the metadata of the call that started its sender (``call_metadata``: a
    caller's credentials, say), so only calls made with the same metadata go together."""
    seen: list[tuple[tuple[tuple[str, str], ...], list[bytes]]] = []
    broker = Broker()

    async def send(topic: str, items: Sequence[Item]) -> PublishResults:
        raw = [i.value if isinstance(i, OutgoingRecord) else i for i in items]
        seen.append((call_metadata.get(), [v.encode() if isinstance(v, str) else v for v in raw]))
        return await broker.send(topic, items)

    async def publish_as(co: PublishCoalescer, who: str, value: bytes) -> PublishResult:
        call_metadata.set((("authorization", who),))
        return await co.publish("t", OutgoingRecord(value))

    async def main() -> None:
        broker.hold = True
        co = PublishCoalescer(send)
        calls = [asyncio.create_task(publish_as(co, who, value))
                 for who, value in (("A", b"a1"), ("B", b"b1"), ("A", b"a2"), ("B", b"b2"))]
        await _until(lambda: len(broker.requests) == 2)  # one sender per caller's metadata
        while not all(c.done() for c in calls):
            broker.gate.set()
            await asyncio.sleep(0.001)

    asyncio.run(main())
    for metadata, values in seen:
        who = dict(metadata)["authorization"]
        assert all(v.decode().startswith(who.lower()) for v in values), (metadata, values)
    assert sorted(v for _, values in seen for v in values) == [b"a1", b"a2", b"b1", b"b2"]
