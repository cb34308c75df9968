"""The leader keeps at most ``max_ephemeral_bytes`` of `ephemeral` records, through the real gRPC API
of a 3-node cluster. Before the bound, each partition's ring held its 10,000 newest records whatever
their size: 300 records of 1 MB grew the leader by 300 MB, and 10,000 by 10 GB, on each new leader
in turn. Readers that fall behind what is kept are told with GAP, as before."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.stubs import stubs
from tests.conftest import rss_bytes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

BUDGET = 8_000_000
VALUE = os.urandom(1_000_000)



@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    c = DevCluster(3, tmp_path_factory.mktemp("ephemeral-budget"),
                   env={**os.environ, "RAFTBROKER_MAX_EPHEMERAL_BYTES": str(BUDGET)})
    c.start()
    try:
        c.wait_ready(60)
        yield c
    finally:
        c.stop()


def test_the_leader_keeps_its_budget_of_ephemeral_records(cluster: DevCluster) -> None:
    address = cluster.wait_ready(60)
    s = stubs(address)
    try:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
            name="live", partitions=2, durability=common_pb2.DURABILITY_EPHEMERAL)), timeout=30)
        pid = cluster.pids[cluster.addresses.index(address)]
        assert pid is not None
        s.broker.Publish(broker_pb2.PublishRequest(topic="live", records=[
            broker_pb2.PublishRecord(value=b"quiet", partition=1)]), timeout=30)
        before = rss_bytes(pid)
        for _ in range(300):
            s.broker.Publish(broker_pb2.PublishRequest(topic="live", records=[
                broker_pb2.PublishRecord(value=VALUE, partition=0)]), timeout=30)
        grown = rss_bytes(pid) - before
        assert grown < 150_000_000, f"the leader grew by {grown} bytes for 300 MB of records"
        info = s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="live"), timeout=30)
        busy, quiet = info.partitions
        assert busy.bytes <= BUDGET and busy.records == busy.end_offset - busy.start_offset < 10
        assert quiet.records == 1  # the busy partition did not push the quiet one out
        request = broker_pb2.SubscribeRequest(topic="live", partition=0, stop_at_end=True,
                                              **{"from": common_pb2.Position(offset=busy.start_offset - 5)})
        first = next(iter(s.broker.Subscribe(request, timeout=30)))
        assert first.HasField("event") and first.event.type == common_pb2.EVENT_TYPE_GAP, first
    finally:
        s.close()
