"""`fsync` topics (SPEC §2.1): created and published with synced submits, `disk` topics without."""

from __future__ import annotations

import pytest

from broker.clock import NodeClock
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, internal_pb2
from tests.core.groups_env import make_env
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit


def test_fsync_topics_submit_synced_and_disk_topics_do_not() -> None:
    state = BrokerStateMachine(MemoryStore(), Changes())
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    log = TopicLog(state, submitter, Limits(), "c/n1", NodeClock())
    info = log.create_topic(internal_pb2.TopicConfig(name="f", durability=internal_pb2.DURABILITY_FSYNC))
    assert info.config.durability == internal_pb2.DURABILITY_FSYNC and replicator.synced_submits == 1
    log.create_topic(internal_pb2.TopicConfig(name="d", durability=internal_pb2.DURABILITY_DISK))
    records = [broker_pb2.PublishRecord(value=b"v%d" % i) for i in range(3)]
    log.publish(publish_request(topic="d", records=records))
    assert replicator.synced_submits == 1
    results = log.publish(publish_request(topic="f", records=records))
    assert [r.offset for r in results] == [0, 1, 2] and replicator.synced_submits == 2


def test_group_commands_of_an_fsync_topic_are_synced_like_its_records() -> None:
    env = make_env()
    env.log.create_topic(internal_pb2.TopicConfig(name="f", durability=internal_pb2.DURABILITY_FSYNC))
    env.topic("d")
    env.publish("f", [b"a", b"b"])
    env.publish("d", [b"a", b"b"])
    before = env.replicator.synced_submits
    env.group("d", "g")
    env.ops.seek("d", "g", internal_pb2.Position(offset=1), None)
    assert env.replicator.synced_submits == before, "a disk topic's group state is not synced"
    rt = env.group("f", "g")
    env.service.ack("f", "g", [r.position for r in env.pick(rt, 1).records])
    env.ops.seek("f", "g", internal_pb2.Position(offset=0), None)
    env.ops.pause("f", "g", True)
    assert env.replicator.synced_submits == before + 4, "create, settle, seek and pause are synced"
