"""``Client.read_range`` / ``end_offsets`` / ``offset_for_timestamp`` against a real cluster: a
bounded range reads exactly its records, and a pruned hole is reported in place, never skipped."""

from __future__ import annotations

import pytest

from broker.client import Batch, Client, InvalidArgument, MissingRange, Record
from broker.devcluster import DevCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_read_range_end_offsets_and_timestamps(cluster: DevCluster) -> None:
    with Client(cluster.addresses) as client:
        client.create_topic("ranges", 2)
        first = client.publish_batch("ranges", [{"value": f"a{i}", "partition": 0} for i in range(50)])
        assert client.end_offsets("ranges") == {0: (0, 50), 1: (0, 0)}
        got = list(client.read_range("ranges", 0, 10, 20))
        assert [(r.offset, r.value) for r in got if isinstance(r, Record)] == [(o, f"a{o}".encode())
                                                                               for o in range(10, 20)]
        assert list(client.read_range("ranges", 1, 0, 0)) == []
        later = client.publish_batch("ranges", [{"value": "b", "partition": 0}])
        assert client.offset_for_timestamp("ranges", 0, later[0].timestamp_ms) <= 50
        assert client.offset_for_timestamp("ranges", 0, first[0].timestamp_ms) == 0
        assert client.offset_for_timestamp("ranges", 1, 0) == 0  # empty partition: its end
        client.prune("ranges", 30, partition=0)
        items = list(client.read_range("ranges", 0, 20, 35))
        assert items[0] == MissingRange("ranges", 0, 20, 30, "skip_forward")
        assert "offsets [20, 30) are no longer in the log" in str(items[0])
        assert [r.offset for r in items[1:] if isinstance(r, Record)] == list(range(30, 35))
        with pytest.raises(InvalidArgument):
            list(client.read_range("ranges", 0, 5, 2))
        with pytest.raises(InvalidArgument):
            client.offset_for_timestamp("ranges", 7, 0)


def flat(items: list[Batch | MissingRange]) -> list[object]:
    """Batches as (offset, value) per record, holes as they are."""
    out: list[object] = []
    for item in items:
        if isinstance(item, Batch):
            out += list(zip(item.offsets, item.values, strict=True))
        else:
            out.append(item)
    return out


def test_read_range_batches_give_the_records_and_holes_read_range_does(cluster: DevCluster) -> None:
    with Client(cluster.addresses) as client:
        client.create_topic("ranges-b", 1)
        for n in (7, 100, 1):  # stored batches of odd sizes, cut by the ranges below
            client.publish_batch("ranges-b", [f"v{i}" for i in range(n)])
        client.prune("ranges-b", 5, partition=0)
        for start, end in ((0, 108), (5, 6), (6, 9), (3, 50), (50, 108), (107, 108), (108, 108)):
            want = [(r.offset, r.value) if isinstance(r, Record) else r
                    for r in client.read_range("ranges-b", 0, start, end)]
            got = list(client.read_range_batches("ranges-b", 0, start, end))
            assert flat(got) == want, (start, end)
            assert all(b.first_offset >= start and b.next_offset <= end for b in got if isinstance(b, Batch))
        with pytest.raises(InvalidArgument):
            list(client.read_range_batches("ranges-b", 0, 5, 2))
