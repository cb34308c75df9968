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
from tests.core.groups_env import make_env
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


def test_records_written_before_format_5_count_as_records_and_cuts_delete_skeletons() -> None:
    """Records of a `memory` topic written before the format rose have no skeleton. A trim after the
    rise skipped them when it walked sizes: the first append to a full `discard_old` topic deleted
    every record, its own included. Cuts also left the skeletons they cut in the durable store."""
    lead = Leader()
    try:
        lead.submitter.submit(formats.set_format_command(formats.MEMORY_SKELETON_FORMAT - 1))
        config = internal_pb2.TopicConfig
        lead.log.create_topic(config(name="five", durability=MEMORY, retention=internal_pb2.Retention(max_records=5)))
        lead.log.create_topic(config(name="many", durability=MEMORY))
        lead.publish("five", *[b"%d" % i for i in range(10)])  # holds 5..9
        lead.publish("many", *[b"m%d" % i for i in range(150)])
        lead.submitter.submit(formats.set_format_command(formats.MEMORY_SKELETON_FORMAT))
        state = lead.tap.state
        five, many = state.topic("five"), state.topic("many")
        assert five is not None and many is not None
        lead.publish("five", b"10")
        st = state.counters(five.topic_id, 0)
        assert (st.start_offset, st.end_offset, st.records) == (6, 11, 5), st
        assert [r.value for r in read(state, "five")] == [b"6", b"7", b"8", b"9", b"10"]
        assert lead.log.prune("many", 0, 10) == 10
        assert state.counters(many.topic_id, 0).records == 140
        lead.publish("many", *[b"n%d" % i for i in range(20)])
        assert lead.log.prune("many", 0, 160) == 150
        assert lead.log.prune("five", 0, 10) == 4
        stored = durable(lead.store)[Column.RECORDS.value]
        kept = [record_log.records.RECORD_KEY.unpack(key) for key, _ in stored]
        assert kept == [(five.topic_id, 0, 10), (many.topic_id, 0, 169)], "skeletons of cut records go with them"
    finally:
        lead.replicator.close()


def test_a_restarted_node_tells_what_it_lost_by_time_and_not_what_was_pruned(leader: Leader) -> None:
    config = internal_pb2.TopicConfig
    retention = internal_pb2.Retention(max_age_ms=1000, max_records=8)
    leader.log.create_topic(config(name="t", durability=MEMORY, retention=retention))
    for i in range(4):  # offsets 2i, 2i+1 at 1,000,000 + 100i
        leader.publish("t", b"%da" % i, b"%db" % i)
        leader.clock.now += 100
    store = MemoryStore()
    follower = machine(store)
    for index, command, _ in leader.tap.log:
        follower.apply(index, command)
    follower = machine(store)
    meta = follower.topic("t")
    assert meta is not None
    assert follower.lost_at_start(meta.topic_id, 0) == (0, 8)
    reader = Reader(follower, EphemeralHub(follower.notify_change), lambda: None)

    def from_time(ms: int) -> list[tuple[int, int]]:
        req = broker_pb2.SubscribeRequest(topic="t", stop_at_end=True, **{"from": common_pb2.Position(timestamp_ms=ms)})
        items = reader.subscribe(wire.subscription(req), lambda: True)
        return [(i.event.offset_before, i.event.offset_after) for i in items if i.HasField("event")]

    assert from_time(1_000_250) == [(6, 8)], "only the lost records at or after the time"
    assert from_time(1_000_000) == [(0, 8)]

    def follow() -> None:
        for index, command, _ in leader.tap.log[len(applied):]:
            follower.apply(index, command)
            applied.append(index)

    applied = [index for index, _, _ in leader.tap.log]
    leader.publish("t", b"x1", b"x2", b"x3")  # 8, 9, 10 at +400: 11 records, the oldest three go
    leader.log.prune("t", 0, 4)
    follow()
    assert follower.lost_at_start(meta.topic_id, 0) == (4, 8), "what was cut since is not told as lost"
    # one apply, two cuts in what it lost: age (4, 5 are older than 1,000 ms at +1,250), then max_records
    leader.log.alter_topic("t", internal_pb2.Retention(max_age_ms=1000, max_records=4),
                           internal_pb2.FULL_POLICY_DISCARD_OLD)
    leader.clock.now = 1_001_250
    leader.log.enforce_retention()
    follow()
    st, view = follower.counters(meta.topic_id, 0), follower.partition(meta.topic_id, 0)
    assert st == leader.tap.state.counters(meta.topic_id, 0) and st.start_offset == 7, st
    held = dict(record_log.sizes(follower.records_store(meta.topic_id), meta.topic_id, 0, 8, 11))
    assert (view.start_offset, view.records, view.bytes) == (8, 3, sum(held.values())), (st, view)
    assert follower.lost_at_start(meta.topic_id, 0) == (7, 8)
    leader.log.prune("t", 0, 9)  # past what it lost: nothing lost is left
    follow()
    assert follower.lost_at_start(meta.topic_id, 0) is None
    assert follower.partition(meta.topic_id, 0) == follower.counters(meta.topic_id, 0)


class _Flushes(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def test_the_rise_to_format_5_flushes_a_journaled_store_so_that_no_replay_crosses_it() -> None:
    """A node's applies skip the store's WAL (the Raft journal replays them after a crash). A replay
    from before the rise would apply those commands with the older rules, which decide `memory`
    topics from what this process holds: after a crash it holds nothing, and it diverged."""
    store = _Flushes()
    state = BrokerStateMachine(store, Changes(), journaled=True)
    state.apply(1, formats.set_format_command(formats.MEMORY_SKELETON_FORMAT - 1).SerializeToString())
    assert store.flushes == 0
    state.apply(2, formats.set_format_command(formats.MEMORY_SKELETON_FORMAT).SerializeToString())
    assert store.flushes == 1 and state.cluster_format == formats.MEMORY_SKELETON_FORMAT
    state.apply(3, formats.set_format_command(formats.MEMORY_SKELETON_FORMAT).SerializeToString())
    assert store.flushes == 1, "once"


@pytest.mark.parametrize("fmt", [formats.MEMORY_SKELETON_FORMAT - 1, formats.MEMORY_SKELETON_FORMAT])
def test_a_group_created_on_a_restarted_leader_is_told_what_it_lost(fmt: int) -> None:
    """A new group starting from earliest (or an offset in what was lost) on a node that lost a
    `memory` topic's records began where the node's records begin, with no event."""
    store = MemoryStore()
    first = make_env(BrokerStateMachine(store, Changes()))
    first.service.submitter.submit(formats.set_format_command(fmt))
    first.log.create_topic(internal_pb2.TopicConfig(name="m", durability=MEMORY))
    first.publish("m", [b"%d" % i for i in range(5)])
    first.replicator.close()
    env = make_env(BrokerStateMachine(store, Changes()))  # the restarted node, now leading
    try:
        env.publish("m", [b"5", b"6"])
        rt = env.group("m", "g")
        delivery = env.pick(rt, stream_id=1)
        assert [(e.type, e.offset_before, e.offset_after) for e in delivery.events] == [
            (common_pb2.EVENT_TYPE_SKIP_FORWARD, 0, 5)]
        assert "lost when this node restarted" in delivery.events[0].detail
        assert [r.value for r in delivery.records] == [b"5", b"6"]
    finally:
        env.replicator.close()


def test_records_written_before_format_5_keep_their_bytes_and_age() -> None:
    """The rise writes one even skeleton per `memory` partition for the records before it: a trim
    counted them as 0 bytes and went on cutting (a full max_bytes topic deleted the record it had
    just acknowledged), and age retention took them for older than any time."""
    lead = Leader()
    try:
        lead.submitter.submit(formats.set_format_command(formats.MEMORY_SKELETON_FORMAT - 1))
        config = internal_pb2.TopicConfig
        lead.log.create_topic(config(name="bytes", durability=MEMORY, retention=internal_pb2.Retention(max_bytes=1000)))
        lead.log.create_topic(config(name="aged", durability=MEMORY,
                                     retention=internal_pb2.Retention(max_age_ms=600_000)))
        lead.publish("bytes", *[b"p" * 100 for _ in range(9)])  # 108 bytes each as stored: 972
        lead.publish("aged", *[b"a%d" % i for i in range(10)])
        state = lead.tap.state
        sized, aged = state.topic("bytes"), state.topic("aged")
        assert sized is not None and aged is not None
        before = state.counters(sized.topic_id, 0)
        lead.submitter.submit(formats.set_format_command(formats.MEMORY_SKELETON_FORMAT))
        lead.publish("bytes", b"n" * 100)  # past 1,000 bytes: the oldest one goes, not all of them
        st = state.counters(sized.topic_id, 0)
        held = dict(record_log.sizes(state.records_store(sized.topic_id), sized.topic_id, 0, st.start_offset, 10))
        assert (st.start_offset, st.end_offset, st.records) == (1, 10, 9), st
        assert st.bytes == sum(held.values()) == before.bytes - held[1] + held[9], (st, held)
        assert lead.log.prune("bytes", 0, 5) == 4
        st = state.counters(sized.topic_id, 0)
        assert st.bytes == sum(size for _, size in record_log.sizes(state.records_store(sized.topic_id),
                                                                    sized.topic_id, 0, 5, 10))
        lead.clock.now += 1000
        lead.log.enforce_retention()  # seconds old, not ten minutes: kept
        assert state.counters(aged.topic_id, 0).start_offset == 0
        lead.clock.now += 600_000
        lead.log.enforce_retention()
        assert state.counters(aged.topic_id, 0).start_offset == 10
    finally:
        lead.replicator.close()
