"""An in-process broker for consumer-group unit tests: the real state machine and group modules over
``MemoryStore`` and ``InMemoryReplicator``, with a clock the test moves."""

from __future__ import annotations

from dataclasses import dataclass

from broker.clock import ManualClock
from broker.core.groups.apply import GroupApplier
from broker.core.members import Peer
from broker.core.retention import Retention
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.groups.delivery import GroupDelivery
from broker.leader.groups.operations import GroupOperations
from broker.leader.groups.runtime import Delivery, GroupRuntime
from broker.leader.groups.service import GroupService
from broker.leader.groups.versions import GroupVersions
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, internal_pb2
from tests.core.wire_inputs import publish_request


@dataclass
class Env:
    state: BrokerStateMachine
    replicator: InMemoryReplicator
    clock: ManualClock
    log: TopicLog
    applier: GroupApplier
    service: GroupService
    ops: GroupOperations
    delivery: GroupDelivery

    def topic(self, name: str, partitions: int = 1) -> None:
        self.log.create_topic(internal_pb2.TopicConfig(name=name, partitions=partitions))

    def publish(self, topic: str, values: list[bytes], key: bytes | None = None,
                partition: int | None = None) -> list[tuple[int, int]]:
        recs = []
        for v in values:
            rec = broker_pb2.PublishRecord(value=v)
            if key is not None:
                rec.key = key
            if partition is not None:
                rec.partition = partition
            recs.append(rec)
        response = self.log.publish(publish_request(topic=topic, records=recs))
        return [(r.partition, r.offset) for r in response]

    def group(self, topic: str, group: str, **config: object) -> GroupRuntime:
        return self.service.ensure(topic, group, internal_pb2.GroupConfig(**config))  # type: ignore[arg-type]

    def pick(self, rt: GroupRuntime, stream_id: int, limit: int = 100, member: str = "m") -> Delivery:
        delivery = rt.pick(stream_id, member, limit, self.clock.now_ms(), self.clock.monotonic_ms())
        if delivery.bad:
            self.service.settle(rt, delivery.bad)
        return delivery

    def restart_leadership(self) -> GroupService:
        """A new leader term: a fresh service, as after a failover to a node with the same state."""
        self.replicator.become_leader()
        self.service = GroupService(self.state, self.applier, self.service.submitter, self.clock)
        self.ops = GroupOperations(self.service)
        self.delivery = GroupDelivery(self.service)
        return self.service


def make_env(state: BrokerStateMachine | None = None) -> Env:
    state = state or BrokerStateMachine(MemoryStore(), Changes())
    retention = Retention(state)
    applier = GroupApplier(state, GroupVersions())
    retention.set_prune_guard(applier.prune_roles)
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    clock = ManualClock()
    log = TopicLog(state, submitter, Limits(), "c/n1", clock)
    service = GroupService(state, applier, submitter, clock)
    return Env(state, replicator, clock, log, applier, service, GroupOperations(service), GroupDelivery(service))


def values(delivery: Delivery) -> list[bytes]:
    return [r.value for r in delivery.records]


def positions(delivery: Delivery) -> list[bytes]:
    return [r.position for r in delivery.records]
