"""`memory` topics across a node restart: from command format 5 every node decides alike
(docs/design/memory-topics.md).

A restarted node holds none of a `memory` topic's records. Before format 5 its applies decided from
that loss (`full_policy=reject` against zeroed counters, trims and prunes from sizes it no longer
had, age from timestamps it no longer had), so its data diverged from the nodes that kept theirs.
Here one leader's committed log is applied by a second state machine that is restarted (or replays
its journal) in the middle; every later apply must have the same outcome and write the same durable
data as on the leader, which never restarted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.clock import NodeClock
from broker.core import formats, record_log
from broker.core.applied import Rejected
from broker.core.members import Peer
from broker.core.retention import Retention
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.ephemeral import EphemeralHub
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

MEMORY = internal_pb2.DURABILITY_MEMORY


class _Clock(NodeClock):
    """The leader's clock, set by the test (the timestamps that age retention reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000

    def now_ms(self) -> int:
        return self.now


def machine(store: MemoryStore) -> BrokerStateMachine:
    """A state machine with retention, as a node builds it (a new one is a new process)."""
    state = BrokerStateMachine(store, Changes())
    Retention(state)
    return state


class _Tap:
    """The leader's state machine, with every applied command and its outcome kept."""

    def __init__(self, state: BrokerStateMachine) -> None:
        self.state = state
        self.log: list[tuple[int, bytes, object]] = []

    def apply(self, index: int, command: bytes | memoryview) -> object:
        result = self.state.apply(index, command)
        self.log.append((index, bytes(command), result))
        return result

    def __getattr__(self, name: str) -> object:
        return getattr(self.state, name)


class Leader:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.tap = _Tap(machine(self.store))
        self.replicator = InMemoryReplicator(self.tap)  # type: ignore[arg-type]
        self.replicator.start()
        self.submitter = CommandSubmitter(self.replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]),
                                          5.0)
        self.clock = _Clock()
        self.log = TopicLog(self.tap.state, self.submitter, Limits(), "c/n1", self.clock,
                            hub=EphemeralHub(self.tap.state.notify_change))

    def publish(self, topic: str, *values: bytes) -> object:
        try:
            return self.log.publish(publish_request(topic=topic, records=[broker_pb2.PublishRecord(value=v)
                                                                        for v in values]))
        except Exception as exc:  # noqa: BLE001 - a refusal is an outcome the follower must share
            return exc


def outcome(result: object) -> str:
    return f"rejected: {result.error}" if isinstance(result, Rejected) else "ok"


def durable(store: MemoryStore) -> dict[str, list[tuple[bytes, bytes]]]:
    return {c.value: list(store.scan(c, b"", b"\xff" * 64)) for c in Column}


def read(state: BrokerStateMachine, topic: str) -> list[common_pb2.Record | common_pb2.Event]:
    reader = Reader(state, EphemeralHub(state.notify_change), lambda: None)
    out: list[common_pb2.Record | common_pb2.Event] = []
    req = broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True)
    for item in reader.subscribe(wire.subscription(req), lambda: True):
        out.extend(item.batch.records) if item.HasField("batch") else out.append(item.event)
    return out


@pytest.fixture
def leader() -> Iterator[Leader]:
    lead = Leader()
    lead.submitter.submit(formats.set_format_command(formats.CODE_FORMAT))
    yield lead
    lead.replicator.close()


def _first_life(lead: Leader) -> None:
    config = internal_pb2.TopicConfig
    lead.log.create_topic(config(name="full", durability=MEMORY, full_policy=internal_pb2.FULL_POLICY_REJECT,
                                 retention=internal_pb2.Retention(max_records=3)))
    lead.log.create_topic(config(name="trim", durability=MEMORY, retention=internal_pb2.Retention(max_bytes=40)))
    lead.log.create_topic(config(name="age", durability=MEMORY, retention=internal_pb2.Retention(max_age_ms=1000)))
    lead.log.create_topic(config(name="cut", durability=MEMORY))
    lead.publish("full", b"a", b"b", b"c")
    lead.publish("trim", *[b"t%02d" % i for i in range(10)])  # 30 bytes
    lead.publish("age", b"old1", b"old2")
    lead.publish("cut", *[b"c%d" % i for i in range(8)])


def _second_life(lead: Leader) -> None:
    assert isinstance(lead.publish("full", b"d"), Exception), "full: refused on the leader"
    lead.publish("trim", b"x" * 12)  # past 40 bytes: the oldest go, by the sizes of records the follower lost
    lead.clock.now += 600
    lead.publish("age", b"young")
    lead.clock.now += 600  # old1, old2 are 1,200 ms old, young 600 ms
    lead.log.enforce_retention()
    assert lead.log.prune("cut", 0, 2) == 2  # counts the bytes of one side: the lost records' sizes
    assert lead.log.prune("cut", 0, 6) == 4  # ... the other side this time (the smaller)
    lead.publish("cut", b"after")


@pytest.mark.parametrize("how", ["restart", "replay"])
def test_a_restarted_node_decides_memory_topic_applies_as_the_others_do(leader: Leader, how: str) -> None:
    _first_life(leader)
    split = len(leader.tap.log)
    _second_life(leader)
    log = leader.tap.log

    follower_store = MemoryStore()
    follower = machine(follower_store)
    flushed = split if how == "restart" else split // 2  # replay: the store lost the later applies
    for index, command, _ in log[:flushed]:
        follower.apply(index, command)
    follower = machine(follower_store)  # a new process: no records in memory
    if how == "replay":
        follower.journal_opened(log[split - 1][0])
    for index, command, result in log[flushed:]:
        assert outcome(follower.apply(index, command)) == outcome(result), (index, command)

    assert durable(follower_store) == durable(leader.store), "the durable data differ"
    for topic in ("full", "trim", "age", "cut"):
        meta = follower.topic(topic)
        assert meta is not None
        assert follower.counters(meta.topic_id, 0) == leader.tap.state.counters(meta.topic_id, 0), topic

    full = follower.topic("full")
    assert full is not None
    view = follower.partition(full.topic_id, 0)  # what its readers see: it holds none of the three
    assert (view.start_offset, view.end_offset, view.records, view.bytes) == (3, 3, 0, 0)
    lost = read(follower, "full")
    assert [(e.type, e.offset_before, e.offset_after) for e in lost] == [(common_pb2.EVENT_TYPE_SKIP_FORWARD, 0, 3)]
    cut = follower.topic("cut")
    assert cut is not None
    view = follower.partition(cut.topic_id, 0)
    held = dict(record_log.sizes(leader.tap.state.records_store(cut.topic_id), cut.topic_id, 0, 6, 9))
    assert (view.start_offset, view.end_offset, view.records, view.bytes) == (8, 9, 1, held[8]), "only 'after'"
    assert follower.counters(cut.topic_id, 0).bytes == sum(held.values())
    assert [r.value for r in read(follower, "cut")[1:]] == [b"after"]
    age = follower.topic("age")
    assert age is not None and leader.tap.state.counters(age.topic_id, 0).start_offset == 2, "old1, old2 expired"


def test_before_format_5_a_restarted_node_decides_from_what_it_holds() -> None:
    """A cluster not yet at format 5 (a rolling upgrade): this release decides as the one before it,
    so nodes of both agree; the skeletons start with the format."""
    lead = Leader()
    try:
        lead.submitter.submit(formats.set_format_command(formats.MEMORY_SKELETON_FORMAT - 1))
        _first_life(lead)
        meta = lead.tap.state.topic("full")
        assert meta is not None
        assert durable(lead.store)[Column.RECORDS.value] == [], "no skeleton before format 5"
        follower_store = MemoryStore()
        follower = machine(follower_store)
        for index, command, _ in lead.tap.log:
            follower.apply(index, command)
        follower = machine(follower_store)
        assert follower.counters(meta.topic_id, 0).records == 0, "as before: what it holds"
        lead.submitter.submit(formats.set_format_command(formats.MEMORY_SKELETON_FORMAT))
        follower.apply(*lead.tap.log[-1][:2])
        assert follower.counters(meta.topic_id, 0).records == 3, "from format 5: the replicated counters"
    finally:
        lead.replicator.close()
