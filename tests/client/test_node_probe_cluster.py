"""``NodeProbe`` against a real 3-node cluster: it asks exactly the node it was made for (a
follower answers as a follower, is never redirected) and raises SDK errors, never gRPC ones."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from broker.client import (
    Client,
    DeadlineExceeded,
    Event,
    InvalidArgument,
    NodeProbe,
    Record,
    TopicNotFound,
    Unavailable,
)
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def leader_index(cluster: DevCluster) -> int:
    cluster.wait_ready(60)
    found = wait_until(lambda: [i for i in [cluster.leader()] if i is not None], 60, "an agreed leader")
    assert isinstance(found, list)
    return int(found[0])


@pytest.fixture
def follower_probe(cluster: DevCluster, leader_index: int) -> Iterator[NodeProbe]:
    follower = next(i for i in range(cluster.nodes) if i != leader_index)
    with NodeProbe(cluster.grpc_address(follower), timeout_s=5.0) as probe:
        yield probe


def test_node_status_is_each_nodes_own_view(cluster: DevCluster, leader_index: int) -> None:
    views = []
    for i in range(cluster.nodes):
        with NodeProbe(cluster.grpc_address(i), timeout_s=5.0) as probe:
            views.append(probe.node_status())
    assert [v.id for v in views] == ["n1", "n2", "n3"]
    leader_id = cluster.node_id(leader_index)
    assert [v.role == "leader" for v in views] == [i == leader_index for i in range(cluster.nodes)]
    assert all(v.role == "follower" for i, v in enumerate(views) if i != leader_index)
    assert all(v.leader_id == leader_id and v.term >= 1 for v in views)


def test_cluster_status_from_a_follower(follower_probe: NodeProbe) -> None:
    status = follower_probe.cluster_status()
    assert sorted(n.id for n in status.nodes) == ["n1", "n2", "n3"]
    assert status.leader is not None and status.leader.role == "leader"


def test_read_partition_reads_what_that_node_holds(cluster: DevCluster, follower_probe: NodeProbe) -> None:
    with Client(cluster.addresses, retry_deadline_s=30) as client:
        client.create_topic("probed", 1)
        client.publish_batch("probed", [f"v{i}" for i in range(50)])

    def read_all() -> list[Record] | None:
        items = list(follower_probe.read_partition("probed", 0, max_batch=7))
        assert not [i for i in items if isinstance(i, Event)]
        got = [i for i in items if isinstance(i, Record)]
        return got if len(got) == 50 else None

    got = wait_until(read_all, 60, "the follower to hold the 50 records")
    assert isinstance(got, list)
    assert [(r.offset, r.value) for r in got] == [(i, f"v{i}".encode()) for i in range(50)]
    assert all(r.topic == "probed" and r.partition == 0 and r.timestamp_ms > 0 for r in got)


def test_read_of_an_unknown_topic_is_topic_not_found(follower_probe: NodeProbe) -> None:
    with pytest.raises(TopicNotFound):
        list(follower_probe.read_partition("no-such-topic", 0))


def test_bad_arguments_are_refused_before_sending(follower_probe: NodeProbe) -> None:
    with pytest.raises(InvalidArgument, match="partition must be >= 0"):
        list(follower_probe.read_partition("probed", -1))
    with pytest.raises(InvalidArgument, match="max_batch must be >= 1"):
        list(follower_probe.read_partition("probed", 0, max_batch=0))
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        NodeProbe("127.0.0.1:1", timeout_s=0)
    with pytest.raises(ValueError, match="one host:port address"):
        NodeProbe(" ")


def test_a_node_that_does_not_answer_raises_at_once_without_trying_others() -> None:
    with socket.socket() as s:  # a port with no listener
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    with NodeProbe(address, timeout_s=2.0) as probe:
        with pytest.raises((Unavailable, DeadlineExceeded)):
            probe.node_status()
        with pytest.raises((Unavailable, DeadlineExceeded)):
            probe.cluster_status()
