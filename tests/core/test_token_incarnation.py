"""A position token against a re-created topic (SPEC §3.3): RESET where its partition still exists,
a precise refusal where it does not, and a token no incarnation of this topic issued is refused
(it got a RESET saying the topic went from a newer incarnation back to an older one)."""

from __future__ import annotations

import pytest

from broker.clock import NodeClock
from broker.core import errors, records
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.reading import Reader
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.services import wire
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, common_pb2, internal_pb2
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit


def first_item(reader: Reader, token: bytes) -> internal_pb2.SubscribeResponse:
    request = broker_pb2.SubscribeRequest(topic="t", **{"from": common_pb2.Position(token=token)})
    item = next(iter(reader.subscribe_steps(wire.subscription(request), lambda: True)))
    assert isinstance(item, internal_pb2.SubscribeResponse), item
    return item


def test_tokens_of_an_earlier_incarnation_and_of_none() -> None:
    state = BrokerStateMachine(MemoryStore(), Changes())
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    log = TopicLog(state, submitter, Limits(), "c/n1", NodeClock())
    reader = Reader(state)
    old = log.create_topic(internal_pb2.TopicConfig(name="t", partitions=2)).incarnation
    log.publish(publish_request(topic="t", records=[broker_pb2.PublishRecord(value=b"x", partition=p)
                                                    for p in (0, 1)]))
    log.drop_topic("t")
    new = log.create_topic(internal_pb2.TopicConfig(name="t", partitions=1)).incarnation
    reset = first_item(reader, records.PositionToken(old, 0, 1).encode())
    assert reset.event.type == common_pb2.EVENT_TYPE_RESET and f"{old} -> {new}" in reset.event.detail
    with pytest.raises(errors.FailedPrecondition, match="partition 1 no longer exists"):
        first_item(reader, records.PositionToken(old, 1, 1).encode())
    with pytest.raises(errors.InvalidArgument, match=f"incarnation {new + 3} is newer than the topic's"):
        first_item(reader, records.PositionToken(new + 3, 0, 0).encode())
    replicator.close()
