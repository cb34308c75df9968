"""Readers of `ephemeral` and `memory` topics are told what they miss (SPEC §3.3: loss is never
silent): records an ephemeral ring drops while a read is under way, a new leader's rings, and
`memory` records a node lost at its restart until something deletes past them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.clock import NodeClock
from broker.core import records
from broker.core.members import Peer
from broker.core.retention import Retention
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.ephemeral import EphemeralHub, EphemeralRecord
from broker.leader.reading import Reader
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.services import wire
from broker.storage import Column
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, common_pb2, internal_pb2
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit

Item = common_pb2.Record | common_pb2.Event


class RacingHub(EphemeralHub):
    """A real hub where a publisher gets in between a reader's ``bounds`` and its ``read`` once,
    appending ``burst`` records: the ring drops as many old ones meanwhile."""

    burst = 0

    def read(self, topic_id: int, partition: int, offset: int, limit: int) -> list[EphemeralRecord]:
        if self.burst:
            n, self.burst = self.burst, 0
            bodies = [internal_pb2.Record(value=b"late%d" % i).SerializeToString() for i in range(n)]
            self.publish(topic_id, self.term, [partition] * n, bodies, now_ms=1)
        return super().read(topic_id, partition, offset, limit)


def make(store: MemoryStore, hub: EphemeralHub
         ) -> tuple[TopicLog, BrokerStateMachine, CommandSubmitter, InMemoryReplicator]:
    state = BrokerStateMachine(store, Changes())
    Retention(state)
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    return TopicLog(state, submitter, Limits(), "c/n1", NodeClock(), hub=hub), state, submitter, replicator


def take(reader: Reader, request: broker_pb2.SubscribeRequest, records: int) -> list[Item]:
    """Items of a live subscription until ``records`` records came (or the stream went idle)."""
    out: list[Item] = []
    for step in reader.subscribe_steps(wire.subscription(request), lambda: True):
        if not isinstance(step, internal_pb2.SubscribeResponse):
            break  # idle: nothing more to read now
        out.extend(step.batch.records) if step.HasField("batch") else out.append(step.event)
        if sum(not is_event(i) for i in out) >= records:
            break
    return out


def is_event(item: Item) -> bool:
    return item.DESCRIPTOR.name == "Event"


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    yield MemoryStore()


def test_records_an_ephemeral_ring_drops_during_a_read_come_with_a_gap(store: MemoryStore) -> None:
    hub = RacingHub(lambda: None, capacity=10)
    log, state, submitter, rep = make(store, hub)
    log.create_topic(internal_pb2.TopicConfig(name="e", durability=internal_pb2.DURABILITY_EPHEMERAL))
    base = log.publish(publish_request(topic="e", records=[broker_pb2.PublishRecord(value=b"%d" % i)
                                                           for i in range(10)]))[0].offset
    reader = Reader(state, hub, leader_term=submitter.leader_term)
    hub.burst = 5
    items = take(reader, broker_pb2.SubscribeRequest(topic="e", partition=0, **{"from": common_pb2.Position(
        offset=base)}), records=10)
    gap = items[0]
    assert is_event(gap) and gap.type == common_pb2.EVENT_TYPE_GAP, items
    assert (gap.offset_before, gap.offset_after) == (base, base + 5)
    assert [r.offset for r in items[1:]] == list(range(base + 5, base + 15))
    rep.close()


def test_a_new_leader_resumes_an_ephemeral_reader_with_a_gap_before_its_first_publish(store: MemoryStore) -> None:
    """This node led term 1; term 2's leader handed out a position; now this node leads term 3 and
    nothing was published in it yet. The position is older than what this leader holds: GAP, not
    "past the end" of the rings this node kept from term 1."""
    hub = EphemeralHub(lambda: None)
    log, state, _, rep = make(store, hub)
    meta = log.create_topic(internal_pb2.TopicConfig(name="e", durability=internal_pb2.DURABILITY_EPHEMERAL))
    hub.publish(meta.incarnation, 1, [0] * 3, [b"a", b"b", b"c"], now_ms=1)  # this node led term 1
    token = records.PositionToken(meta.incarnation, 0, (2 << 32) + 7).encode()  # from term 2's leader
    reader = Reader(state, hub, leader_term=lambda: 3)
    items = take(reader, broker_pb2.SubscribeRequest(topic="e", **{"from": common_pb2.Position(token=token)}), 1)
    assert len(items) == 1 and is_event(items[0]), items
    assert items[0].type == common_pb2.EVENT_TYPE_GAP
    assert (items[0].offset_before, items[0].offset_after) == ((2 << 32) + 7, 3 << 32)
    rep.close()


def test_a_memory_partition_tells_readers_what_a_restart_lost_until_a_prune_passes_it(store: MemoryStore) -> None:
    log, _, _, rep = make(store, EphemeralHub(lambda: None))
    log.create_topic(internal_pb2.TopicConfig(name="m", durability=internal_pb2.DURABILITY_MEMORY))
    log.publish(publish_request(topic="m", records=[broker_pb2.PublishRecord(value=b"%d" % i) for i in range(4)]))
    rep.close()
    log, state, _, rep = make(store, EphemeralHub(lambda: None))  # a restart: the records are gone
    log.publish(publish_request(topic="m", records=[broker_pb2.PublishRecord(value=b"%d" % i) for i in range(3)]))
    reader = Reader(state)
    items = take(reader, broker_pb2.SubscribeRequest(topic="m"), records=3)
    assert is_event(items[0]) and (items[0].offset_before, items[0].offset_after) == (0, 4)
    assert [r.offset for r in items[1:]] == [4, 5, 6]
    log.prune("m", None, 5)  # deleted past what was lost: earliest is the first record held, no event
    assert [(i.DESCRIPTOR.name, getattr(i, "offset", None)) for i in take(reader, broker_pb2.SubscribeRequest(
        topic="m"), records=2)] == [("Record", 5), ("Record", 6)]
    rep.close()


def test_a_memory_partition_frees_the_batch_a_cap_cuts_into() -> None:
    """A stored value straddling a cut stays and is filtered on read; in memory it kept the bodies of
    its whole batch, which no counter (and so no budget) counts: a topic capped at one record fed
    batches of 1,000 held 1,000 records per partition."""
    volatile = MemoryStore()
    state = BrokerStateMachine(MemoryStore(), Changes(), volatile)
    Retention(state)
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    log = TopicLog(state, submitter, Limits(), "c/n1", NodeClock())
    log.create_topic(internal_pb2.TopicConfig(name="m", durability=internal_pb2.DURABILITY_MEMORY,
                                              retention=internal_pb2.Retention(max_records=2)))
    for _ in range(3):
        log.publish(publish_request(topic="m", records=[broker_pb2.PublishRecord(value=b"%04d" % i + b"x" * 1000)
                                                        for i in range(1000)]))
    held = sum(len(raw) for _, raw in volatile.scan(Column.RECORDS, b"", b"\xff" * 16))
    assert held < 4_000, held  # two records of ~1 KB, not a batch of 1,000
    reader = Reader(state)
    assert [r.value[:4] for r in take(reader, broker_pb2.SubscribeRequest(topic="m"), records=2)] == [b"0998", b"0999"]
    assert [(p.start_offset, p.end_offset, p.records) for p in log.describe_topic("m").partitions] == [(2998, 3000, 2)]
    replicator.close()


def test_a_hub_lets_its_rings_go_when_the_node_stops_leading() -> None:
    hub = EphemeralHub(lambda: None)
    hub.publish(1, 3, [0, 0], [b"a", b"b"], now_ms=1)
    assert hub.bytes_held == 2
    hub.let_go()
    assert hub.bytes_held == 0 and hub.bounds(1, 0)[2] == 0
    assert hub.publish(1, 3, [0], [b"c"], now_ms=2)[0][1] == 3 << 32  # leading again: a fresh ring
