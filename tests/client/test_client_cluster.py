"""The SDK against a real 3-node cluster (one cluster shared by the module)."""

from __future__ import annotations

import threading

import pytest

from broker.client import (
    Batch,
    Client,
    Event,
    InvalidArgument,
    Record,
    TopicExists,
    TopicNotFound,
    Watermark,
)
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


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


def batches(items: list[Batch | Event]) -> list[Batch]:
    return [i for i in items if isinstance(i, Batch)]


def test_batches_carry_what_subscribe_delivers(client: Client) -> None:
    client.create_topic("bat", 3)
    sent = [*client.publish_batch("bat", [{"value": f"v{i}", "key": f"k{i}" if i % 2 else None,
                                          "headers": {"i": str(i)} if i % 3 else {},
                                          "op": "update" if i % 4 else "insert"} for i in range(300)])]
    sent += client.publish_batch("bat", [{"value": b"", "partition": p} for p in range(3)])
    want = records(list(client.subscribe("bat", stop_at_end=True)))
    got = batches(list(client.subscribe_batches("bat", stop_at_end=True, max_batch=17)))
    assert all(1 <= len(b) <= 17 for b in got)
    flat = [(b.partition, o, v, k, h, op, ts) for b in got for o, v, k, h, op, ts in
            zip(b.offsets, b.values, b.keys(), b.headers(), b.ops(), b.timestamps_ms, strict=True)]
    assert sorted(flat) == sorted((r.partition, r.offset, r.value, r.key, dict(r.headers), r.op, r.timestamp_ms)
                                  for r in want)
    assert len(flat) == len(sent)
    tokens = {(r.partition, r.offset): r.position for r in want}
    for b in got:
        assert b.topic == "bat" and b.next_position == tokens[(b.partition, b.next_offset - 1)]


def test_batch_positions(client: Client) -> None:
    client.create_topic("bpos", 1)
    first = client.publish_batch("bpos", [f"m{i}" for i in range(6)])
    client.publish_batch("bpos", [f"n{i}" for i in range(4)])

    def offsets(**options: object) -> list[int]:
        return [o for b in batches(list(client.subscribe_batches("bpos", stop_at_end=True, **options)))  # type: ignore[arg-type]
                for o in b.offsets]

    assert offsets(start=4) == list(range(4, 10)), "from inside a stored batch, across the next"
    assert offsets(start=4, max_batch=1) == list(range(4, 10))
    head = batches(list(client.subscribe_batches("bpos", stop_at_end=True, max_batch=3)))[0]
    assert (head.first_offset, head.values) == (0, [b"m0", b"m1", b"m2"])
    assert offsets(start=head.next_position) == list(range(3, 10))
    assert offsets(timestamp_ms=first[0].timestamp_ms) == list(range(10))
    assert offsets(start="latest") == []
    with pytest.raises(InvalidArgument):
        client.subscribe_batches("bpos", max_batch=-1)


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


def test_idempotency_keys_and_dedup_window(client: Client) -> None:
    info = client.create_topic("keys", 2, dedup_window_ms=-1)
    assert info.dedup_window_ms == -1
    assert client.create_topic("keys-default", 1).dedup_window_ms == 120_000, "None: the server default"
    first = client.publish("keys", "a", idempotency_key="order-1", partition=1)
    again = client.publish("keys", "a", idempotency_key="order-1", partition=0)
    assert not first.duplicate and again.duplicate
    assert (again.partition, again.offset, again.timestamp_ms) == (first.partition, first.offset, first.timestamp_ms)
    batch = client.publish_batch("keys", [{"value": "b", "idempotency_key": "order-2"},
                                          {"value": "b", "idempotency_key": "order-2"}, "c"])
    assert [r.duplicate for r in batch] == [False, True, False], "repeats inside one batch too"
    assert (batch[1].partition, batch[1].offset) == (batch[0].partition, batch[0].offset)
    assert client.describe_topic("keys").records == 3


def test_watermarks_api(client: Client) -> None:
    client.create_topic("marks", 2)
    assert client.get_watermarks("marks") == []
    sent = client.publish_batch("marks", ["m1", "m2", "m3"], dedup_id="feed", first_msg_id=1)
    assert not any(r.duplicate for r in sent)
    client.publish_batch("marks", [{"value": "x1", "msg_id": 1}, {"value": "x2", "msg_id": -2}], dedup_id="other")
    assert client.get_watermarks("marks") == [Watermark("feed", 3), Watermark("other", 2)]

    resent = client.publish_batch("marks", ["m2", "m3", "m4"], dedup_id="feed", first_msg_id=2)
    assert [r.duplicate for r in resent] == [True, True, False], "at or below the watermark: discarded"
    assert [(r.offset, r.timestamp_ms) for r in resent[:2]] == [(0, 0), (0, 0)], "no original place is kept"
    with pytest.raises(InvalidArgument):
        client.publish("marks", "gap", dedup_id="feed", msg_id=9)  # the watermark is 4: 5 comes next
    assert client.get_watermarks("marks")[0] == Watermark("feed", 4)

    assert client.reset_watermark("marks", "feed") is True
    assert client.get_watermarks("marks") == [Watermark("other", 2)]
    assert not client.publish("marks", "again", dedup_id="feed", msg_id=1).duplicate, "a reset session restarts at 1"
    assert client.reset_watermark("marks", "never-seen") is False  # a no-op, said so
    with pytest.raises(InvalidArgument, match="dedup_id"):
        client.reset_watermark("marks", "x" * 10_000)
    got = records(list(client.subscribe("marks", stop_at_end=True)))
    assert sorted(r.msg_id for r in got) == sorted(["1", "2", "3", "1", "-2", "4", "1"])
    assert len(got) == 7, "discarded duplicates stored nothing"
    with pytest.raises(TopicNotFound):
        client.get_watermarks("missing")
    with pytest.raises(TopicNotFound):
        client.reset_watermark("missing", "feed")
