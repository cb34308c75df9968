"""`memory` topics are bounded on every node (SPEC §2.1), through the real gRPC API of a 3-node cluster.

Before the bound, a `memory` topic without retention caps grew every node's memory at once until
each was killed for it: a whole cluster down together. Now the leader refuses an append past the
node's ``max_memory_topics_bytes`` with RESOURCE_EXHAUSTED and stores nothing of it; topics whose
``discard_old`` byte caps fit the budget are never refused, other classes are not counted, and a
clear gives the room back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.digests import wait_converged
from tests.cluster.stubs import Stubs, refused, stubs

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

BUDGET = 2_000_000
BATCH = [broker_pb2.PublishRecord(value=os.urandom(10_000)) for _ in range(10)]  # ~100 KB a batch


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, Stubs]]:
    cluster = DevCluster(3, tmp_path_factory.mktemp("memory-budget"),
                         env={**os.environ, "RAFTBROKER_MAX_MEMORY_TOPICS_BYTES": str(BUDGET)})
    cluster.start()
    try:
        s = stubs(cluster.wait_ready(60))
        yield cluster, s
        s.close()
    finally:
        cluster.stop()


def create(s: Stubs, name: str, durability: int, max_bytes: int | None = None) -> None:
    retention = common_pb2.Retention(max_bytes=max_bytes) if max_bytes is not None else None
    s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
        name=name, durability=durability, retention=retention)), timeout=30)  # type: ignore[arg-type]


def publish(s: Stubs, topic: str) -> None:
    s.broker.Publish(broker_pb2.PublishRequest(topic=topic, records=BATCH), timeout=30)


def held(s: Stubs, topic: str) -> tuple[int, int]:
    """(end offset, bytes) of the topic's one partition."""
    p = s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name=topic), timeout=30).partitions[0]
    return p.end_offset, p.bytes


def test_memory_topics_are_bounded_on_every_node(leader: tuple[DevCluster, Stubs]) -> None:
    cluster, s = leader
    create(s, "capped", common_pb2.DURABILITY_MEMORY, max_bytes=500_000)
    for _ in range(30):  # 3 MB through a topic whose cap keeps 500 KB: never refused
        publish(s, "capped")
    create(s, "open", common_pb2.DURABILITY_MEMORY)
    sent = 0
    while True:
        try:
            publish(s, "open")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            assert "max_memory_topics_bytes (2000000)" in (exc.details() or ""), exc.details()
            break
        sent += 1
        assert sent < 100, "10 MB went into memory topics with a budget of 2 MB"
    assert 10 <= sent <= 15, sent  # 1.5 MB left beside the 500 KB "capped" reserves
    end, size = held(s, "open")
    assert end == 10 * sent and size <= BUDGET - 500_000  # nothing of the refused batch
    code, _ = refused(lambda: publish(s, "open"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and held(s, "open")[0] == end
    publish(s, "capped")  # a topic with a cap reserved it: never refused for the budget
    # a cap is a reservation: one that does not fit beside what is held is refused, and changes nothing
    code, message = refused(lambda: create(s, "big", common_pb2.DURABILITY_MEMORY, max_bytes=400_000))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "would reserve 400000 bytes" in message, message
    assert "big" not in {t.config.name for t in s.admin.ListTopics(admin_pb2.ListTopicsRequest()).topics}
    alter = admin_pb2.AlterTopicRequest(name="capped", retention=common_pb2.Retention(max_bytes=900_000))
    code, message = refused(lambda: s.admin.AlterTopic(alter, timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "would reserve 900000 bytes" in message, message
    described = s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="capped"), timeout=30)
    assert described.config.retention.max_bytes == 500_000
    create(s, "durable", common_pb2.DURABILITY_DISK)
    for _ in range(30):  # other classes are not counted
        publish(s, "durable")
    s.admin.ClearTopic(admin_pb2.ClearTopicRequest(name="open"), timeout=30)
    publish(s, "open")  # the room is back
    wait_converged(cluster)


def counted(s: Stubs) -> int:
    """What the memory topics hold or reserve, as the budget counts them."""
    total = 0
    for topic in s.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=30).topics:
        if topic.config.durability != common_pb2.DURABILITY_MEMORY:
            continue
        cap = topic.config.retention.max_bytes if topic.config.retention.HasField("max_bytes") else None
        total += sum(cap if cap is not None else p.bytes for p in topic.partitions)
    return total


def test_publishes_in_flight_together_do_not_pass_the_budget(leader: tuple[DevCluster, Stubs]) -> None:
    """Each publish was checked against the applied counters alone, so concurrent ones all passed
    the check before any was applied: 16 batches of 90 KB went into a 100 KB budget."""
    _, s = leader
    create(s, "burst", common_pb2.DURABILITY_MEMORY)
    room = BUDGET - counted(s)
    n = room // 100_000 + 12  # more than the room, all at once

    def attempt(_: int) -> grpc.StatusCode:
        try:
            publish(s, "burst")
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    with ThreadPoolExecutor(n) as pool:
        codes = list(pool.map(attempt, range(n)))
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes
    assert counted(s) <= BUDGET, (counted(s), codes.count(grpc.StatusCode.OK))
