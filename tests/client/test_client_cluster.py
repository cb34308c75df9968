"""The SDK against a real 3-node cluster (one cluster shared by the module)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from broker.client import (
    Client,
    Event,
    InvalidArgument,
    Record,
    TopicExists,
    TopicNotFound,
)
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def client(cluster: DevCluster) -> Iterator[Client]:
    cluster.wait_ready()
    with Client(cluster.addresses, retry_deadline_s=30) as c:
        yield c


def records(items: list[Record | Event]) -> list[Record]:
    return [i for i in items if isinstance(i, Record)]


def test_create_list_describe_drop(client: Client) -> None:
    info = client.create_topic("life", 3, retention={"max_records": 1000}, durability="disk",
                               full_policy="reject")
    assert (info.name, info.partition_count, info.durability, info.full_policy) == ("life", 3, "disk", "reject")
    assert info.retention.max_records == 1000
    assert "life" in [t.name for t in client.list_topics()]
    described = client.describe_topic("life")
    assert [p.partition for p in described.partitions] == [0, 1, 2]
    assert all(p.start_offset == p.end_offset == 0 for p in described.partitions)
    client.drop_topic("life")
    wait_until(lambda: "life" not in [t.name for t in client.list_topics()], 10, "the topic to go")
    with pytest.raises(TopicNotFound):
        client.describe_topic("life")


def test_publish_then_subscribe_round_trip(client: Client) -> None:
    client.create_topic("trip", 2)
    sent = [client.publish("trip", f"v{i}", key=f"k{i}", headers={"i": str(i)}) for i in range(10)]
    sent += client.publish_batch("trip", [{"value": b"\x00\xff", "partition": 1}, "plain"])
    got = records(list(client.subscribe("trip", stop_at_end=True)))
    assert sorted((r.partition, r.offset) for r in got) == sorted((s.partition, s.offset) for s in sent)
    by_value = {r.value: r for r in got}
    assert by_value[b"v3"].key == b"k3" and by_value[b"v3"].headers == {"i": "3"}
    assert by_value[b"\x00\xff"].partition == 1
    assert all(r.timestamp_ms > 0 and r.position for r in got)
    for p in (0, 1):
        offsets = [r.offset for r in got if r.partition == p]
        assert offsets == list(range(len(offsets))), "contiguous, in order"
    assert client.describe_topic("trip").records == len(sent)


def test_subscribe_positions(client: Client) -> None:
    client.create_topic("pos", 1)
    first = client.publish_batch("pos", [f"m{i}" for i in range(6)])
    from_offset = records(list(client.subscribe("pos", partition=0, start=4, stop_at_end=True)))
    assert [r.offset for r in from_offset] == [4, 5]
    all_records = records(list(client.subscribe("pos", stop_at_end=True)))
    from_token = records(list(client.subscribe("pos", partition=0, start=all_records[2].position,
                                               stop_at_end=True)))
    assert [r.offset for r in from_token] == [3, 4, 5]
    from_time = records(list(client.subscribe("pos", timestamp_ms=first[0].timestamp_ms, stop_at_end=True)))
    assert [r.offset for r in from_time] == [0, 1, 2, 3, 4, 5]
    assert records(list(client.subscribe("pos", start="latest", stop_at_end=True))) == []


def test_live_tail_delivers_new_records(client: Client) -> None:
    client.create_topic("tail", 1)
    got: list[Record] = []
    sub = client.subscribe("tail", start=0)  # the end of the empty log: only new records come

    def read() -> None:
        for item in sub:
            if isinstance(item, Record):
                got.append(item)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    client.publish_batch("tail", ["a", "b"])
    wait_until(lambda: len(got) == 2, 10, "the tail to deliver two records")
    sub.close()
    reader.join(5)
    assert not reader.is_alive() and [r.value for r in got] == [b"a", b"b"]


def test_only_a_followers_address_is_enough(cluster: DevCluster) -> None:
    leader = cluster.wait_ready()
    follower = next(a for a in cluster.addresses if a != leader)
    with Client([follower], retry_deadline_s=30) as c:
        c.create_topic("via-follower", 1)
        assert c.publish("via-follower", "x").offset == 0
        assert c.leader == leader
        assert [r.value for r in records(list(c.subscribe("via-follower", stop_at_end=True)))] == [b"x"]


def test_error_types(client: Client) -> None:
    client.create_topic("errs", 1)
    with pytest.raises(TopicExists) as exists:
        client.create_topic("errs", 1)
    assert exists.value.code == "ALREADY_EXISTS"
    with pytest.raises(TopicNotFound):
        client.describe_topic("missing")
    with pytest.raises(TopicNotFound):
        client.publish("missing", "x")
    with pytest.raises(TopicNotFound):
        client.drop_topic("missing")
    with pytest.raises(TopicNotFound):
        list(client.subscribe("missing", stop_at_end=True))
    with pytest.raises(InvalidArgument) as bad_name:
        client.create_topic("bad name")
    assert bad_name.value.code == "INVALID_ARGUMENT" and "bad name" in bad_name.value.message
    with pytest.raises(InvalidArgument):
        client.create_topic("too-many", 100_000)
    with pytest.raises(InvalidArgument):
        client.publish("errs", b"x" * (2 << 20))  # over the server's 1 MiB default record limit
    with pytest.raises(InvalidArgument):
        client.publish("errs", "x", partition=5)
    assert client.describe_topic("errs").records == 0, "nothing was stored by the bad requests"
