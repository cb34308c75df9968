"""The three requests that used to stop a whole cluster for good (issue 11, item 2) are now refused
with INVALID_ARGUMENT before anything is replicated, and the cluster keeps serving after each; so is
a forged start position past the end, which only the leader can tell from a follower's lag."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from broker.client import Client, InvalidArgument
from broker.core import records
from broker.devcluster import DevCluster
from broker.services.errors import LEADER_METADATA_KEY
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.digests import wait_converged
from tests.cluster.stubs import Stubs, stubs

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]
LONG_TOPIC = "y" * 245  # a valid topic name whose dead-letter name `<topic>.<group>.dlq` is too long


@pytest.fixture(scope="module")
def leader(cluster: DevCluster) -> Iterator[Stubs]:
    s = stubs(cluster.wait_ready())
    for name in ("poison", LONG_TOPIC):
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name=name)), timeout=30)
    s.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="poison", group="g"), timeout=30)
    yield s
    s.close()


def refused(call: object) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value
    return str(info.value.details())


def still_serving(cluster: DevCluster, s: Stubs, before: int) -> None:
    """A canary commits and every node applies past ``before``."""
    s.broker.Publish(broker_pb2.PublishRequest(topic="poison", records=[broker_pb2.PublishRecord(value=b"canary")]),
                     timeout=30)
    assert wait_converged(cluster, 60) > before


def groups_of(s: Stubs, topic: str) -> list[str]:
    return [g.group for g in s.admin.ListGroups(admin_pb2.ListGroupsRequest(topic=topic), timeout=30).groups]


@pytest.mark.parametrize("group", ["g\n", "g\r\n", "h\n"])
def test_a_group_name_ending_in_a_newline_is_invalid(cluster: DevCluster, leader: Stubs, group: str) -> None:
    before = wait_converged(cluster)
    message = refused(lambda: leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="poison", group=group),
                                                       timeout=30))
    assert "invalid group name" in message
    sub = broker_pb2.SubscribeRequest(topic="poison", group=group)
    refused(lambda: next(iter(leader.broker.Subscribe(sub, timeout=30))))
    assert groups_of(leader, "poison") == ["g"]
    still_serving(cluster, leader, before)


def test_a_group_whose_dead_letter_topic_name_would_be_too_long_is_invalid(cluster: DevCluster,
                                                                           leader: Stubs) -> None:
    before = wait_converged(cluster)
    message = refused(lambda: leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic=LONG_TOPIC, group="g"),
                                                       timeout=30))
    assert "dead-letter topic name" in message and "too long" in message
    assert groups_of(leader, LONG_TOPIC) == []
    still_serving(cluster, leader, before)


def test_a_nack_delay_beyond_the_maximum_with_a_forged_token_is_invalid(cluster: DevCluster,
                                                                        leader: Stubs) -> None:
    leader.broker.Publish(broker_pb2.PublishRequest(topic="poison", records=[broker_pb2.PublishRecord(value=b"r")]),
                          timeout=30)
    incarnation = leader.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="poison"), timeout=30).incarnation
    forged = records.PositionToken(incarnation, 0, 1).encode()  # record 0, never delivered: no lease
    before = wait_converged(cluster)
    for delay in (2**63 - 1, 12 * 3600 * 1000 + 1, -1):
        message = refused(lambda d=delay: leader.broker.Nack(
            broker_pb2.NackRequest(topic="poison", group="g", positions=[forged], delay_ms=d), timeout=30))
        assert "delay_ms" in message
    lag = leader.admin.GroupLag(admin_pb2.GroupLagRequest(topic="poison", group="g"), timeout=30)
    assert all(p.retrying == 0 for p in lag.partitions)
    still_serving(cluster, leader, before)


def test_extend_beyond_the_maximum_is_invalid(cluster: DevCluster, leader: Stubs) -> None:
    incarnation = leader.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="poison"), timeout=30).incarnation
    token = records.PositionToken(incarnation, 0, 1).encode()
    for length in (10 * 365 * 24 * 3600 * 1000, 2**63 - 1, -5):
        message = refused(lambda n=length: leader.broker.Extend(
            broker_pb2.ExtendRequest(topic="poison", group="g", positions=[token], extend_ms=n), timeout=30))
        assert "extend_ms" in message


def test_a_forged_position_past_the_end_is_invalid_at_the_leader_and_sent_on_by_a_follower(
        cluster: DevCluster, leader: Stubs) -> None:
    """A follower cannot tell a position past its end from one it has not applied yet (a client
    resuming after a failover brings a token another node issued), so it answers UNAVAILABLE with
    the leader's address (NOT_LEADER) and the SDK follows it; the leader refuses the position as
    INVALID_ARGUMENT. Nothing changes, and the cluster keeps serving."""
    incarnation = leader.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="poison"), timeout=30).incarnation
    forged = records.PositionToken(incarnation, 0, 10**12).encode()
    before = wait_converged(cluster)
    for start in ({"token": forged}, {"offset": 10**12}):
        sub = broker_pb2.SubscribeRequest(topic="poison", partition=0, **{"from": common_pb2.Position(**start)})
        assert "is past the end" in refused(lambda r=sub: next(iter(leader.broker.Subscribe(r, timeout=30))))
        index = cluster.leader()
        assert index is not None
        follower = stubs(cluster.grpc_address((index + 1) % 3))
        try:
            with pytest.raises(grpc.RpcError) as sent:
                next(iter(follower.broker.Subscribe(sub, timeout=30)))
            assert sent.value.code() == grpc.StatusCode.UNAVAILABLE, sent.value
            assert (LEADER_METADATA_KEY, cluster.grpc_address(index)) in tuple(sent.value.trailing_metadata() or ())
        finally:
            follower.close()
        with Client([cluster.grpc_address((index + 1) % 3)], retry_deadline_s=30) as client:
            subscription = client.subscribe("poison", partition=0, start=forged if "token" in start else 10**12)
            with pytest.raises(InvalidArgument, match="past the end"):
                next(iter(subscription))
    still_serving(cluster, leader, before)
