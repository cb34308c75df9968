"""A subscription continues after its stream breaks, from the last delivered record's token."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from broker.client import Client, Record
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
