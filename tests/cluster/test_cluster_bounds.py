"""Bounds on what one caller can make every node carry, through the real gRPC API of a 3-node cluster
(an audit measured each before its bound):

- topics: 46,600 made an idle cluster lose its leader every few seconds (every node's housekeeping
  apply visited each one); now ``max_topics`` (groups' dead-letter topics count) refuses more;
- members of a stream-mode group: each join rebuilt the assignment in O(members x partitions),
  9,000 fresh member ids took 0.5 s per join and the leadership; now at most 1,024 per group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import grpc
import pytest

from broker.devcluster import DevCluster
from broker.leader.groups.service import MEMBERS_MAX
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.stubs import Stubs, refused, stubs

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def leader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stubs]:
    cluster = DevCluster(3, tmp_path_factory.mktemp("bounds"), env={**os.environ, "RAFTBROKER_MAX_TOPICS": "4"})
    cluster.start()
    try:
        s = stubs(cluster.wait_ready(60))
        yield s
        s.close()
    finally:
        cluster.stop()


def names(s: Stubs) -> set[str]:
    return {t.config.name for t in s.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=30).topics}


def create(s: Stubs, name: str) -> object:
    return s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name=name, partitions=2)),
                               timeout=30)


def test_topics_are_capped_dead_letter_topics_included(leader: Stubs) -> None:
    for name in ("a", "b", "c"):
        create(leader, name)
    leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="a", group="g"), timeout=30)  # a.g.dlq: 4 topics
    assert names(leader) == {"a", "b", "c", "a.g.dlq"}
    code, message = refused(lambda: create(leader, "d"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_topics (4)" in message, message
    code, message = refused(lambda: leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="b", group="g"),
                                                             timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "dead-letter topic" in message, message
    assert names(leader) == {"a", "b", "c", "a.g.dlq"}, "the refusals created nothing"
    # a live group's dead-letter topic cannot be dropped: the group's next dead letter re-created it,
    # past max_topics too
    code, message = refused(lambda: leader.admin.DropTopic(admin_pb2.DropTopicRequest(name="a.g.dlq"), timeout=30))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "dead-letter topic of group 'g'" in message, message
    leader.admin.DropTopic(admin_pb2.DropTopicRequest(name="c"), timeout=30)
    create(leader, "d")  # room again


def test_a_stream_mode_group_takes_at_most_its_members(leader: Stubs) -> None:
    config = common_pb2.GroupConfig(mode=common_pb2.DELIVERY_MODE_STREAM, session_timeout_ms=600_000)
    leader.admin.DropTopic(admin_pb2.DropTopicRequest(name="d"), timeout=30)  # room for a.s.dlq

    def join(member: str) -> broker_pb2.JoinGroupResponse:
        return leader.broker.JoinGroup(broker_pb2.JoinGroupRequest(topic="a", group="s", member_id=member,
                                                                   group_config=config), timeout=30)

    for i in range(MEMBERS_MAX):
        join(f"m{i}")
    code, message = refused(lambda: join("one-more"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and f"has {MEMBERS_MAX} members" in message, message
    code, _ = refused(lambda: leader.broker.Heartbeat(broker_pb2.HeartbeatRequest(topic="a", group="s",
                                                                                  member_id="one-more"), timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, "a heartbeat of an unknown id joins: capped as well"
    join("m0")  # a member already in keeps beating
    leader.broker.LeaveGroup(broker_pb2.LeaveGroupRequest(topic="a", group="s", member_id="m1"), timeout=30)
    assert join("one-more").member_id == "one-more"
    described = leader.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(topic="a", group="s"), timeout=30)
    assert len(described.members) == MEMBERS_MAX
