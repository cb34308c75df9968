"""A subscription continues after its stream breaks, from the last delivered record's token."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import pytest

from broker.client import Client, Record
from broker.client.aio import AsyncClient
from tests.client.fakes import FakeNode

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture
def node() -> Iterator[FakeNode]:
    n = FakeNode("n1")
    yield n
    n.stop()


def values(items: Sequence[object]) -> list[tuple[int, int, bytes]]:
    return [(r.partition, r.offset, r.value) for r in items if isinstance(r, Record)]


def test_single_partition_resumes_from_the_token(node: FakeNode) -> None:
    node.script.topics["t"] = 1
    node.script.logs[("t", 0)] = [b"a", b"b", b"c", b"d"]
    node.script.break_stream_after = 2
    with Client([node.address], retry_deadline_s=5) as client:
        got = list(client.subscribe("t", partition=0, stop_at_end=True))
    assert values(got) == [(0, 0, b"a"), (0, 1, b"b"), (0, 2, b"c"), (0, 3, b"d")]
    resumed = node.calls("Subscribe")[1]
    assert getattr(resumed, "from").HasField("token")


def test_all_partitions_resume_per_partition_without_loss_or_repeats(node: FakeNode) -> None:
    node.script.topics["t"] = 3
    for p in range(3):
        node.script.logs[("t", p)] = [f"{p}-{i}".encode() for i in range(5)]
    node.script.break_stream_after = 7  # partition 0 done, partition 1 half-way
    with Client([node.address], retry_deadline_s=5) as client:
        got = values(list(client.subscribe("t", stop_at_end=True)))
    assert sorted(got) == [(p, i, f"{p}-{i}".encode()) for p in range(3) for i in range(5)]
    for p in range(3):
        offsets = [o for q, o, _ in got if q == p]
        assert offsets == sorted(offsets), "order per partition is kept"


def test_breaking_out_of_the_loop_cancels_the_stream(node: FakeNode) -> None:
    node.script.topics["t"] = 1
    node.script.logs[("t", 0)] = [b"x"] * 10
    with Client([node.address]) as client:
        sub = client.subscribe("t")
        first = next(sub)
        sub.close()
        assert isinstance(first, Record)
        assert list(sub) == []


@pytest.mark.parametrize("partition", [None, 0])
def test_a_latest_stream_reopened_before_any_record_starts_where_latest_was(node: FakeNode,
                                                                           partition: int | None) -> None:
    """Reopened with "latest" again, a stream that broke before it delivered anything skipped what
    was committed while it was down, with nothing said (a follower killed under a live tail)."""
    node.script.topics["t"] = 1
    node.script.logs[("t", 0)] = [b"old-0", b"old-1", b"old-2"]
    node.script.break_next_streams = 1
    node.script.on_break = lambda: node.script.logs[("t", 0)].extend([b"new-3", b"new-4"])
    with Client([node.address], retry_deadline_s=5) as client:
        got = values(list(client.subscribe("t", partition=partition, start="latest", stop_at_end=True)))
    assert got == [(0, 3, b"new-3"), (0, 4, b"new-4")]


def test_an_asyncio_latest_subscription_starts_where_latest_was_when_its_stream_breaks(node: FakeNode) -> None:
    node.script.topics["t"] = 1
    node.script.logs[("t", 0)] = [b"old-0"]
    node.script.break_next_streams = 1
    node.script.on_break = lambda: node.script.logs[("t", 0)].append(b"new-1")

    async def read() -> list[object]:
        async with AsyncClient([node.address], retry_deadline_s=5) as client:
            return [item async for item in client.subscribe("t", start="latest", stop_at_end=True)]

    assert values(asyncio.run(read())) == [(0, 1, b"new-1")]
