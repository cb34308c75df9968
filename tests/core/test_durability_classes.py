"""`memory` and `ephemeral` topics in the core (SPEC §2.1)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from broker.clock import NodeClock
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.ephemeral import EphemeralHub
from broker.leader.memory_topics import InFlight
from broker.leader.reading import Reader
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, Placement, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.services import wire
from broker.storage import Column
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, common_pb2, internal_pb2
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit


def make(store: MemoryStore, ring: int = 10_000) -> tuple[TopicLog, Reader, InMemoryReplicator]:
    state = BrokerStateMachine(store, Changes())
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    hub = EphemeralHub(state.notify_change, capacity=ring)
    log = TopicLog(state, submitter, Limits(), "c/n1", NodeClock(), hub=hub)
    return log, Reader(state, hub, submitter.ensure_leader), replicator


def read(reader: Reader, topic: str, **kw: object) -> list[common_pb2.Record | common_pb2.Event]:
    out: list[common_pb2.Record | common_pb2.Event] = []
    req = broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True, **kw)  # type: ignore[arg-type]
    for item in reader.subscribe(wire.subscription(req), lambda: True):
        out.extend(item.batch.records) if item.HasField("batch") else out.append(item.event)
    return out


def publish(log: TopicLog, topic: str, n: int) -> list[Placement]:
    recs = [broker_pb2.PublishRecord(value=b"%d" % i) for i in range(n)]
    return list(log.publish(publish_request(topic=topic, records=recs)))


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    yield MemoryStore()


def test_memory_topic_keeps_offsets_but_not_records_across_a_reload(store: MemoryStore) -> None:
    log, reader, rep = make(store)
    log.create_topic(internal_pb2.TopicConfig(name="m", durability=internal_pb2.DURABILITY_MEMORY))
    log.create_topic(internal_pb2.TopicConfig(name="d"))
    publish(log, "m", 5)
    publish(log, "d", 5)
    first = read(reader, "m")
    assert len(first) == 5
    token = first[1].position
    rep.close()
    log, reader, rep = make(store)  # a restart: same durable store, new process memory
    assert log.describe_topic("m").partitions[0].end_offset == 5  # metadata survives
    earliest = read(reader, "m")  # the reader is told what the restart lost, not started silently at 5
    assert len(earliest) == 1 and earliest[0].type == common_pb2.EVENT_TYPE_SKIP_FORWARD
    assert (earliest[0].offset_before, earliest[0].offset_after) == (0, 5)
    assert "lost when this node restarted" in earliest[0].detail
    events = read(reader, "m", **{"from": common_pb2.Position(token=token)})
    assert len(events) == 1 and events[0].type == common_pb2.EVENT_TYPE_SKIP_FORWARD
    assert (events[0].offset_before, events[0].offset_after) == (2, 5)
    assert [r.offset for r in publish(log, "m", 2)] == [5, 6]  # offsets are never reused
    by_time = read(reader, "m", **{"from": common_pb2.Position(timestamp_ms=1)})
    assert [type(i).__name__ for i in by_time] == ["Event", "Record", "Record"], by_time
    assert (by_time[0].offset_before, by_time[0].offset_after) == (0, 5)
    assert [r.offset for r in read(reader, "m", **{"from": common_pb2.Position(timestamp_ms=2**62)})] == []
    assert len(read(reader, "d")) == 5  # disk topics are untouched
    rep.close()


def test_ephemeral_topic_fans_out_from_a_bounded_buffer_and_signals_gaps(store: MemoryStore) -> None:
    log, reader, rep = make(store, ring=10)
    log.create_topic(internal_pb2.TopicConfig(name="e", durability=internal_pb2.DURABILITY_EPHEMERAL))
    results = publish(log, "e", 25)
    base = results[0].offset
    assert [r.offset for r in results] == list(range(base, base + 25))
    items = read(reader, "e", partition=0, **{"from": common_pb2.Position(offset=base)})
    gap = items[0]
    assert gap.type == common_pb2.EVENT_TYPE_GAP
    assert (gap.offset_before, gap.offset_after) == (base, base + 15)
    assert [r.value for r in items[1:]] == [b"%d" % i for i in range(15, 25)]
    assert list(store.scan(Column.RECORDS, b"", b"\xff" * 16)) == []
    keyed = publish_request(topic="e", records=[broker_pb2.PublishRecord(value=b"x", idempotency_key="k")])
    first, again = log.publish(keyed)[0], log.publish(keyed)[0]
    assert again.offset == first.offset + 1 and not again.duplicate, "keys are accepted and not remembered"
    with pytest.raises(Exception, match="do not deduplicate"):
        log.publish(publish_request(topic="e", dedup_id="s", records=[broker_pb2.PublishRecord(
            value=b"x", msg_id=1)]))
    rep.close()


def test_ephemeral_timestamps_do_not_go_back_when_the_leader_clock_does() -> None:
    hub = EphemeralHub(lambda: None)
    hub.publish(1, 1, [0], [b"a"], now_ms=5000)
    placed = hub.publish(1, 1, [0, 1], [b"b", b"c"], now_ms=4000)
    assert [ts for _, _, ts, _ in placed] == [5000, 4000]  # partition 1 has no floor of its own yet
    assert [r.timestamp_ms for r in hub.read(1, 0, 0, 10)] == [5000, 5000]


class _Tap:
    """The real state machine, with every applied (index, command) kept: the log of a first life."""

    def __init__(self, state: BrokerStateMachine) -> None:
        self.state = state
        self.log: list[tuple[int, bytes]] = []

    def apply(self, index: int, command: bytes | memoryview) -> object:
        self.log.append((index, bytes(command)))
        return self.state.apply(index, command)

    def __getattr__(self, name: str) -> object:
        return getattr(self.state, name)


def test_replayed_appends_of_memory_topics_keep_no_records(store: MemoryStore) -> None:
    """A restart whose store lost its unflushed applies (no RocksDB WAL: the Raft journal replays them)
    must still lose `memory` records: the commands the journal held at start keep none (SPEC §2.1)."""
    tap = _Tap(BrokerStateMachine(MemoryStore(), Changes()))
    replicator = InMemoryReplicator(tap)  # type: ignore[arg-type]
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    first = TopicLog(tap.state, submitter, Limits(), "c/n1", NodeClock(), hub=EphemeralHub(tap.state.notify_change))
    first.create_topic(internal_pb2.TopicConfig(name="m", durability=internal_pb2.DURABILITY_MEMORY))
    first.create_topic(internal_pb2.TopicConfig(name="d"))
    publish(first, "m", 3)
    publish(first, "d", 3)
    publish(first, "m", 2)  # applied after the restart: the journal did not hold it yet
    replicator.close()
    *journaled, (live_index, live_command) = tap.log

    state = BrokerStateMachine(store, Changes())  # the second life: nothing of the first was flushed
    state.journal_opened(journaled[-1][0])
    for index, command in journaled:
        state.apply(index, command)
    hub = EphemeralHub(state.notify_change)
    reader = Reader(state, hub, lambda: None)
    m, d = state.topic("m"), state.topic("d")
    assert m is not None and d is not None
    assert (state.partition(m.topic_id, 0).start_offset, state.partition(m.topic_id, 0).end_offset) == (3, 3)
    lost = read(reader, "m")
    assert [(e.type, e.offset_before, e.offset_after) for e in lost] == [(common_pb2.EVENT_TYPE_SKIP_FORWARD, 0, 3)]
    assert [r.value for r in read(reader, "d")] == [b"0", b"1", b"2"]
    state.apply(live_index, live_command)
    assert [(r.offset, r.value) for r in read(reader, "m")[1:]] == [(3, b"0"), (4, b"1")]


def test_a_release_run_by_the_garbage_collector_inside_a_take_does_not_deadlock() -> None:
    """A publish dropped unanswered is released by a weakref finalizer, which the garbage collector
    may run at any allocation, also inside :meth:`InFlight.take` on the thread holding its lock: the
    release took the lock too, the thread waited for itself, and the leader answered nothing more."""
    flight = InFlight()
    first = flight.take(lambda held: None, 10)
    seen: list[int] = []
    done = threading.Event()

    def check(held: int) -> None:
        seen.append(held)
        first()  # the finalizer, run inside the check

    def take_while_released() -> None:
        flight.take(check, 5)
        done.set()

    worker = threading.Thread(target=take_while_released, daemon=True)
    worker.start()
    assert done.wait(10), "take deadlocked on a release run inside it"
    assert seen == [10] and flight.bytes == 5
    first()  # idempotent
    assert flight.bytes == 5
