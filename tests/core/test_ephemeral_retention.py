"""Retention caps and ``full_policy=reject`` on an ``ephemeral`` topic (SPEC §2.1, §2.2): such a
topic keeps no log, so the caps would never apply; create and alter refuse them by name
(INVALID_ARGUMENT) and change nothing, instead of storing a config that is silently ignored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.clock import ManualClock
from broker.core import errors
from broker.core.members import Peer
from broker.core.retention import Retention
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.storage.memory import MemoryStore
from broker.v1 import internal_pb2

pytestmark = pytest.mark.unit

EPHEMERAL = internal_pb2.DURABILITY_EPHEMERAL


@pytest.fixture
def log() -> Iterator[TopicLog]:
    state = BrokerStateMachine(MemoryStore(), Changes())
    Retention(state)
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    yield TopicLog(state, submitter, Limits(), "c/n1", ManualClock())
    replicator.close()


@pytest.mark.parametrize(("config", "said"), [
    ({"retention": internal_pb2.Retention(max_records=1)}, "retention max_records would never apply"),
    ({"retention": internal_pb2.Retention(max_age_ms=5, max_bytes=9)}, "retention max_age_ms, max_bytes"),
    ({"full_policy": internal_pb2.FULL_POLICY_REJECT}, "full_policy reject would never apply"),
])
def test_an_ephemeral_topic_with_retention_is_refused_at_create(log: TopicLog, config: dict[str, object],
                                                                said: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=said):
        log.create_topic(internal_pb2.TopicConfig(name="e", durability=EPHEMERAL, **config))  # type: ignore[arg-type]
    assert log.list_topics() == []


def test_an_ephemeral_topic_refuses_caps_at_alter_and_keeps_its_config(log: TopicLog) -> None:
    log.create_topic(internal_pb2.TopicConfig(name="e", durability=EPHEMERAL))
    with pytest.raises(errors.InvalidArgument, match="retention max_records would never apply"):
        log.alter_topic("e", internal_pb2.Retention(max_records=1), internal_pb2.FULL_POLICY_UNSPECIFIED)
    with pytest.raises(errors.InvalidArgument, match="full_policy reject"):
        log.alter_topic("e", internal_pb2.Retention(), internal_pb2.FULL_POLICY_REJECT)
    config = log.describe_topic("e").config
    assert not config.retention.ListFields() and config.full_policy == internal_pb2.FULL_POLICY_DISCARD_OLD
    log.alter_topic("e", internal_pb2.Retention(), internal_pb2.FULL_POLICY_UNSPECIFIED)  # no caps: fine


def test_stored_topics_keep_their_caps(log: TopicLog) -> None:
    for durability in (internal_pb2.DURABILITY_MEMORY, internal_pb2.DURABILITY_DISK):
        name = f"t{durability}"
        log.create_topic(internal_pb2.TopicConfig(name=name, durability=durability, retention=internal_pb2.Retention(
            max_records=3), full_policy=internal_pb2.FULL_POLICY_REJECT))
        altered = log.alter_topic(name, internal_pb2.Retention(max_bytes=10), internal_pb2.FULL_POLICY_UNSPECIFIED)
        assert altered.config.retention.max_bytes == 10
        assert altered.config.full_policy == internal_pb2.FULL_POLICY_REJECT
