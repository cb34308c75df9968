"""Stateless subscriptions against a real cluster: positions, tokens, live tail."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.stubs import Stubs, stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def leader(cluster: DevCluster) -> Iterator[Stubs]:
    s = stubs(cluster.wait_ready())
    yield s
    s.close()


def create(s: Stubs, name: str, partitions: int = 1) -> None:
    s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name=name, partitions=partitions)))


def publish(s: Stubs, topic: str, values: list[bytes], partition: int | None = None) -> broker_pb2.PublishResponse:
    recs = [broker_pb2.PublishRecord(value=v, partition=partition) if partition is not None
            else broker_pb2.PublishRecord(value=v) for v in values]
    resp: broker_pb2.PublishResponse = s.broker.Publish(broker_pb2.PublishRequest(topic=topic, records=recs))
    return resp


def read_all(s: Stubs, topic: str, **kw: object) -> list[common_pb2.Record | common_pb2.Event]:
    req = broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True, **kw)  # type: ignore[arg-type]
    out: list[common_pb2.Record | common_pb2.Event] = []
    for item in s.broker.Subscribe(req, timeout=30):
        if item.HasField("batch"):
            out.extend(item.batch.records)
        else:
            out.append(item.event)
    return out


def test_positions_earliest_latest_offset_and_token(leader: Stubs) -> None:
    create(leader, "pos")
    publish(leader, "pos", [b"a", b"b", b"c", b"d"])
    recs = read_all(leader, "pos")
    assert [r.value for r in recs] == [b"a", b"b", b"c", b"d"]
    assert [r.offset for r in recs] == [0, 1, 2, 3]
    assert read_all(leader, "pos", **{"from": common_pb2.Position(start=common_pb2.START_POSITION_LATEST)}) == []
    from_2 = read_all(leader, "pos", partition=0, **{"from": common_pb2.Position(offset=2)})
    assert [r.value for r in from_2] == [b"c", b"d"]
    token = recs[1].position
    resumed = read_all(leader, "pos", **{"from": common_pb2.Position(token=token)})
    assert [r.value for r in resumed] == [b"c", b"d"]


def test_subscribe_from_timestamp_starts_at_first_record_at_or_after_it(leader: Stubs) -> None:
    create(leader, "times")
    publish(leader, "times", [b"old1", b"old2"])
    time.sleep(0.02)  # make the next batch's leader timestamp strictly later (wall clock ms)
    cut = publish(leader, "times", [b"new1", b"new2"]).results[0].timestamp_ms
    assert cut > publish(leader, "times", [b"probe"]).results[0].timestamp_ms - 10_000
    got = read_all(leader, "times", **{"from": common_pb2.Position(timestamp_ms=cut)})
    assert [r.value for r in got][:2] == [b"new1", b"new2"]
    assert all(r.timestamp_ms >= cut for r in got)
    assert read_all(leader, "times", **{"from": common_pb2.Position(timestamp_ms=cut + 3_600_000)}) == []


def test_live_subscriber_sees_a_new_record_within_a_bounded_time(cluster: DevCluster, leader: Stubs) -> None:
    create(leader, "live", partitions=3)
    # subscribe through a follower: it is woken by its own applies, not by polling
    leader_index = cluster.leader()
    assert leader_index is not None
    follower = stubs(cluster.grpc_address((leader_index + 1) % cluster.nodes))

    def follower_knows_topic() -> bool:
        try:
            follower.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="live"), timeout=2)
            return True
        except grpc.RpcError:
            return False

    wait_until(follower_knows_topic, 10, "the follower to apply the topic's creation")
    got: queue.Queue[tuple[float, common_pb2.Record]] = queue.Queue()
    call = follower.broker.Subscribe(broker_pb2.SubscribeRequest(
        # from offset 0 of the empty topic, not LATEST: LATEST is resolved when the server takes the
        # call, which may be after the first publish below is applied (then that record is not "new")
        topic="live", **{"from": common_pb2.Position(offset=0)}))

    def consume() -> None:
        try:
            for item in call:
                for rec in item.batch.records:
                    got.put((time.monotonic(), rec))
        except grpc.RpcError:
            pass

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        latencies = []
        for i in range(5):
            sent = time.monotonic()
            publish(leader, "live", [b"hello-%d" % i])
            arrived, rec = got.get(timeout=5)  # the bound: 5 s, far above the ~10-100 ms expected
            assert rec.value == b"hello-%d" % i
            latencies.append(arrived - sent)
        assert max(latencies) < 5
    finally:
        call.cancel()
        thread.join(5)
        follower.close()


def test_all_partitions_in_order_per_partition(leader: Stubs) -> None:
    create(leader, "multi", partitions=3)
    for p in range(3):
        publish(leader, "multi", [b"%d-%d" % (p, i) for i in range(50)], partition=p)
    recs = read_all(leader, "multi", max_batch=7)
    assert len(recs) == 150
    for p in range(3):
        mine = [r for r in recs if r.partition == p]
        assert [r.offset for r in mine] == list(range(50))
        assert [r.value for r in mine] == [b"%d-%d" % (p, i) for i in range(50)]


def test_keyed_records_land_on_the_documented_partition(leader: Stubs) -> None:
    from broker.leader.partitioning import partition_for_key

    create(leader, "keyed", partitions=4)
    keys = [b"user-%d" % i for i in range(20)]
    resp = leader.broker.Publish(broker_pb2.PublishRequest(
        topic="keyed", records=[broker_pb2.PublishRecord(key=k, value=b"v") for k in keys]))
    assert [r.partition for r in resp.results] == [partition_for_key(k, 4) for k in keys]
