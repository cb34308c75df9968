"""Every bad input gets a precise status and changes nothing (SPEC §5, §9)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.stubs import Stubs, stubs
from tests.conftest import start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def leader(cluster: DevCluster) -> Iterator[Stubs]:
    s = stubs(cluster.wait_ready())
    s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="errs", partitions=2)))
    yield s
    s.close()


def code_of(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    err = info.value
    return err.code(), err.details()


def describe(s: Stubs, name: str = "errs") -> admin_pb2.TopicInfo:
    info: admin_pb2.TopicInfo = s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name=name))
    return info


def test_unknown_topic_is_not_found(leader: Stubs) -> None:
    req = broker_pb2.PublishRequest(topic="nope", records=[broker_pb2.PublishRecord(value=b"x")])
    code, msg = code_of(lambda: leader.broker.Publish(req))
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in msg
    code, _ = code_of(lambda: describe(leader, "nope"))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = code_of(lambda: leader.admin.DropTopic(admin_pb2.DropTopicRequest(name="nope")))
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = code_of(lambda: next(iter(leader.broker.Subscribe(broker_pb2.SubscribeRequest(topic="nope")))))
    assert code == grpc.StatusCode.NOT_FOUND


def test_duplicate_create_is_already_exists(leader: Stubs) -> None:
    req = admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="errs", partitions=5))
    code, _ = code_of(lambda: leader.admin.CreateTopic(req))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert len(describe(leader).partitions) == 2


@pytest.mark.parametrize("name", ["", "-x", "a b", "x" * 250, "ü", "a/b"])
def test_bad_topic_names_are_invalid(leader: Stubs, name: str) -> None:
    req = admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name=name))
    code, msg = code_of(lambda: leader.admin.CreateTopic(req))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "topic name" in msg


@pytest.mark.parametrize("partitions", [1025, 100000])
def test_bad_partition_counts_are_invalid(leader: Stubs, partitions: int) -> None:
    req = admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="many", partitions=partitions))
    code, msg = code_of(lambda: leader.admin.CreateTopic(req))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "partitions" in msg


def test_bad_records_are_invalid_and_store_nothing(leader: Stubs) -> None:
    before = describe(leader)
    cases = [
        broker_pb2.PublishRequest(topic="errs", records=[]),
        broker_pb2.PublishRequest(topic="errs", records=[broker_pb2.PublishRecord(value=b"x" * ((1 << 20) + 1))]),
        broker_pb2.PublishRequest(topic="errs", records=[broker_pb2.PublishRecord(value=b"ok"),
                                                         broker_pb2.PublishRecord(value=b"x", partition=7)]),
        broker_pb2.PublishRequest(topic="errs", records=[broker_pb2.PublishRecord(value=b"x", op=42)]),  # type: ignore[arg-type]
    ]
    for req in cases:
        code, _ = code_of(lambda req=req: leader.broker.Publish(req))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, req
    assert describe(leader) == before


def test_bad_subscribe_positions_are_invalid(leader: Stubs) -> None:
    bad = [
        broker_pb2.SubscribeRequest(topic="errs", partition=9),
        broker_pb2.SubscribeRequest(topic="errs", partition=0, **{"from": common_pb2.Position(offset=10**9)}),
        broker_pb2.SubscribeRequest(topic="errs", **{"from": common_pb2.Position(token=b"garbage")}),
    ]
    for req in bad:
        code, _ = code_of(lambda req=req: next(iter(leader.broker.Subscribe(req))))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, req


def test_membership_requests_are_checked(leader: Stubs) -> None:
    code, msg = code_of(lambda: leader.admin.AddNode(admin_pb2.AddNodeRequest(id="n9")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "raft_address" in msg
    code, msg = code_of(lambda: leader.admin.AddNode(admin_pb2.AddNodeRequest(
        id="bad id", raft_address="127.0.0.1:1", grpc_address="127.0.0.1:2")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "node id" in msg
    code, msg = code_of(lambda: leader.admin.RemoveNode(admin_pb2.RemoveNodeRequest(id="n9")))
    assert code == grpc.StatusCode.NOT_FOUND and "'n9'" in msg


def test_group_rpcs_on_an_unknown_group_say_not_found(leader: Stubs) -> None:
    code, msg = code_of(lambda: leader.broker.Ack(broker_pb2.AckRequest(topic="errs", group="nobody")))
    assert code == grpc.StatusCode.NOT_FOUND and "'nobody'" in msg


def test_follower_redirects_writes_with_leader_metadata(cluster: DevCluster, leader: Stubs) -> None:
    leader_index = cluster.leader()
    assert leader_index is not None
    follower = stubs(cluster.grpc_address((leader_index + 1) % cluster.nodes))
    try:
        req = broker_pb2.PublishRequest(topic="errs", records=[broker_pb2.PublishRecord(value=b"x")])
        with pytest.raises(grpc.RpcError) as info:
            follower.broker.Publish(req)
        err = info.value
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        metadata = dict(err.trailing_metadata())
        assert metadata["x-leader"] == cluster.grpc_address(leader_index)
    finally:
        follower.close()


def test_malformed_bytes_do_not_crash_a_node(cluster: DevCluster, leader: Stubs) -> None:
    """Raw garbage where a protobuf message is expected: an error status, and the node lives on."""
    call = leader.channel.unary_unary("/broker.v1.Broker/Publish")
    for garbage in (b"\xff\xff\xff", b"\x12\x05abc", bytes(range(256))):
        with pytest.raises(grpc.RpcError):
            call(garbage)
    assert describe(leader).config.name == "errs"


@pytest.mark.timeout(180)
def test_no_quorum_answers_unavailable_within_the_bound(tmp_path: Path) -> None:
    c = start_cluster(tmp_path)
    try:
        leader_index = c.leader()
        assert leader_index is not None
        s = stubs(c.grpc_address(leader_index))
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="q")))
        for i in range(c.nodes):
            if i != leader_index:
                c.kill(i)
        req = broker_pb2.PublishRequest(topic="q", records=[broker_pb2.PublishRecord(value=b"x")])
        # the surviving node must answer UNAVAILABLE, quickly and every time (never hang)
        for _ in range(3):
            started = time.monotonic()
            code, msg = code_of(lambda: s.broker.Publish(req, timeout=30))
            assert code == grpc.StatusCode.UNAVAILABLE, msg
            assert time.monotonic() - started < 10
        wait_until(lambda: c.node_status(leader_index) is not None, 10, "the survivor to answer status")
        s.close()
    finally:
        c.stop()
