"""Retention caps with both full policies, age expiry, prune and clear (SPEC §2.2), in the core."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from broker.clock import ManualClock
from broker.core import errors, record_log
from broker.core.members import Peer
from broker.core.retention import Retention
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.publishing import PublishBatch
from broker.leader.reading import Reader
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, PartitionFigures, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.services import wire
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, common_pb2, internal_pb2
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit
Env = tuple[TopicLog, Reader, BrokerStateMachine, ManualClock]


@pytest.fixture
def env() -> Iterator[Env]:
    state = BrokerStateMachine(MemoryStore(), Changes())
    Retention(state)
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    clock = ManualClock()
    yield TopicLog(state, submitter, Limits(), "c/n1", clock), Reader(state), state, clock
    replicator.close()


def create(log: TopicLog, name: str, policy: int = internal_pb2.FULL_POLICY_DISCARD_OLD, **caps: int) -> None:
    log.create_topic(internal_pb2.TopicConfig(name=name, full_policy=policy,  # type: ignore[arg-type]
                                           retention=internal_pb2.Retention(**caps)))


def pub(log: TopicLog, topic: str, n: int, size: int = 10, start: int = 0) -> None:
    recs = [broker_pb2.PublishRecord(value=(b"%d:" % (start + i)).ljust(size, b".")) for i in range(n)]
    log.publish(publish_request(topic=topic, records=recs))


def part(log: TopicLog, topic: str) -> PartitionFigures:
    return log.describe_topic(topic).partitions[0]


def read(reader: Reader, topic: str, **kw: object) -> list[common_pb2.Record | common_pb2.Event]:
    out: list[common_pb2.Record | common_pb2.Event] = []
    for item in reader.subscribe(wire.subscription(broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True, **kw)),  # type: ignore[arg-type]
                                 lambda: True):
        out.extend(item.batch.records) if item.HasField("batch") else out.append(item.event)
    return out


def stored(state: BrokerStateMachine) -> int:
    """Readable records from each partition's start offset (a batch straddling a cut keeps the
    bytes of the records below it, which no reader is given)."""
    count = 0
    for meta in state.topics():
        for p in range(meta.config.partitions):
            st = state.partition(meta.topic_id, p)
            count += sum(1 for _ in record_log.read(state.store, meta.topic_id, p, st.start_offset, st.end_offset))
    return count


def test_max_records_discard_old_keeps_the_newest(env: Env) -> None:
    log, reader, state, _ = env
    create(log, "t", max_records=5)
    pub(log, "t", 3)
    pub(log, "t", 9, start=3)  # one batch larger than the cap
    p = part(log, "t")
    assert (p.start_offset, p.end_offset, p.records) == (7, 12, 5)
    assert [r.offset for r in read(reader, "t")] == [7, 8, 9, 10, 11]
    assert stored(state) == 5


def test_max_bytes_discard_old(env: Env) -> None:
    log, _, _, _ = env
    create(log, "b", max_bytes=100)
    pub(log, "b", 30)
    p = part(log, "b")
    assert p.bytes <= 100 and p.records == p.end_offset - p.start_offset and p.records >= 1


def test_reject_policy_refuses_the_whole_batch(env: Env) -> None:
    log, _, state, _ = env
    create(log, "r", policy=internal_pb2.FULL_POLICY_REJECT, max_records=5)
    pub(log, "r", 4)
    with pytest.raises(errors.ResourceExhausted, match="max_records=5"):
        pub(log, "r", 2)
    assert part(log, "r").records == 4 and stored(state) == 4
    pub(log, "r", 1)
    assert part(log, "r").records == 5


def test_reject_policy_by_bytes_refuses_the_batch_that_would_pass_max_bytes(
        env: Env) -> None:
    log, _, state, _ = env
    create(log, "rb", policy=internal_pb2.FULL_POLICY_REJECT, max_bytes=60)
    pub(log, "rb", 1)
    used = part(log, "rb").bytes
    assert 0 < used <= 60
    with pytest.raises(errors.ResourceExhausted, match="max_bytes=60"):
        pub(log, "rb", 60 // used + 1, start=1)
    assert part(log, "rb").bytes == used and stored(state) == 1, "nothing of the refused batch"


@pytest.mark.parametrize("policy", [internal_pb2.FULL_POLICY_DISCARD_OLD, internal_pb2.FULL_POLICY_REJECT])
def test_a_record_larger_than_max_bytes_alone_is_refused_on_the_leader(env: Env, policy: int) -> None:
    """Such a record could never be kept: discard_old acknowledged its offset and deleted it in the
    same apply; reject called an empty partition full. Now INVALID_ARGUMENT names the record and the
    cap, nothing is stored, and records that fit are still taken."""
    log, _, state, _ = env
    create(log, "big", policy=policy, max_bytes=200)
    with pytest.raises(errors.InvalidArgument, match=r"record 1 is \d+ bytes stored, over topic 'big'.*max_bytes=200"):
        log.publish(publish_request(topic="big", records=[broker_pb2.PublishRecord(value=b"small"),
                                                          broker_pb2.PublishRecord(value=b"x" * 300)]))
    assert part(log, "big").end_offset == 0 and stored(state) == 0, "nothing of the refused batch"
    lean = PublishBatch("big", bodies=[internal_pb2.RecordBody(value=b"x" * 300).SerializeToString()])
    with pytest.raises(errors.InvalidArgument, match="record 0 .* could never be kept"):  # the packed form too
        log.publish(lean)
    pub(log, "big", 2, size=50)
    assert part(log, "big").records == 2


def test_max_age_expires_old_records(env: Env) -> None:
    log, reader, _, clock = env
    create(log, "a", max_age_ms=60_000)
    pub(log, "a", 3)
    clock.advance(30_000)
    pub(log, "a", 2, start=3)
    clock.advance(40_000)  # the first three are now 70 s old, the others 40 s
    log.enforce_retention()
    assert part(log, "a").start_offset == 3
    events = read(reader, "a", partition=0, **{"from": common_pb2.Position(offset=0)})
    assert events[0].type == common_pb2.EVENT_TYPE_SKIP_FORWARD
    assert [r.offset for r in events[1:]] == [3, 4]


def test_alter_lowers_a_cap_and_enforcement_applies_it(env: Env) -> None:
    log, _, _, _ = env
    create(log, "x")
    pub(log, "x", 10)
    info = log.alter_topic("x", internal_pb2.Retention(max_records=4), internal_pb2.FULL_POLICY_UNSPECIFIED)
    assert info.config.retention.max_records == 4 and info.config.full_policy == internal_pb2.FULL_POLICY_DISCARD_OLD
    log.enforce_retention()
    assert part(log, "x").records == 4
    with pytest.raises(errors.InvalidArgument):
        log.alter_topic("x", internal_pb2.Retention(max_records=-1), internal_pb2.FULL_POLICY_UNSPECIFIED)


def test_prune_and_clear(env: Env) -> None:
    log, reader, state, _ = env
    create(log, "p")
    pub(log, "p", 10)
    assert log.prune("p", 0, 4) == 4
    assert log.prune("p", None, 2) == 0  # never moves backwards
    assert part(log, "p").start_offset == 4 and stored(state) == 6
    assert log.clear_topic("p") == 6
    pub(log, "p", 1)
    p = part(log, "p")
    assert (p.start_offset, p.end_offset, p.records) == (10, 11, 1)  # offsets keep growing
    with pytest.raises(errors.InvalidArgument):
        log.prune("p", 5, 1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cuts_keep_the_counters_exact_whichever_side_is_counted(env: Env, seed: int) -> None:
    """A cut counts what goes or what stays, whichever is smaller, and nothing for a cut to the end
    (a clear of 10M records read each one and stalled every node): the counters must equal the
    records that stay, batches cut through included, with caps trimming in the same apply."""
    log, _, state, _ = env
    rng = random.Random(seed)
    create(log, "cuts")
    create(log, "capped", max_records=7)
    for i in range(40):
        for topic in ("cuts", "capped"):
            pub(log, topic, rng.randint(1, 6), size=rng.randint(1, 50), start=i * 10)
        if rng.random() < 0.4:
            figures = part(log, "cuts")
            target = rng.randint(figures.start_offset, figures.end_offset)
            if rng.random() < 0.2:
                log.clear_topic("cuts")
            else:
                log.prune("cuts", 0, target)
        for topic in ("cuts", "capped"):
            meta = state.topic(topic)
            assert meta is not None
            st = state.partition(meta.topic_id, 0)
            sizes = list(record_log.sizes(state.records_store(meta.topic_id), meta.topic_id, 0, st.start_offset,
                                          st.end_offset))
            assert (st.records, st.bytes) == (len(sizes), sum(s for _, s in sizes)), (topic, st)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cap_cuts_land_where_dropping_the_oldest_one_by_one_would(env: Env, seed: int) -> None:
    """``discard_old`` finds its cut without walking each record it passes (a cap lowered from 10M
    records to 1,000 walked them all in one apply): the cut must be where dropping the oldest
    record one at a time until the partition fits both caps would stop, in an append's own trim
    (this apply's records counted) and in an enforcement after a cap is lowered, across values of
    1,024 records and bodies of every element-prefix width."""
    log, _, state, _ = env
    rng = random.Random(seed)
    create(log, "capped")
    create(log, "mirror")
    meta, mirror = state.topic("capped"), state.topic("mirror")
    assert meta is not None and mirror is not None
    held: list[int] = []  # the body sizes the partition should hold, oldest first
    caps: dict[str, int] = {}
    first = 0

    def trim() -> None:
        nonlocal first
        while held and (len(held) > caps.get("max_records", len(held)) or sum(held) > caps.get("max_bytes", sum(held))):
            held.pop(0)
            first += 1

    for step in range(60):
        if rng.random() < 0.3:
            caps = {name: rng.choice(limits) for name, limits in (("max_records", (5, 900, 1500, 4000)),
                                                                    ("max_bytes", (320, 20_000, 400_000)))
                    if rng.random() < 0.6}
            log.alter_topic("capped", internal_pb2.Retention(**caps), internal_pb2.FULL_POLICY_DISCARD_OLD)
            log.enforce_retention()
        else:
            count = rng.choice((1, 3, 700, 1100))
            values = [(b"%d:" % step + b"." * size)[:size]
                      for size in [rng.choice((1, 40, 120, 125, 126, 300)) for _ in range(count)]]
            for topic in ("capped", "mirror"):  # the mirror (no caps) tells each record's stored bytes
                log.publish(publish_request(topic=topic, records=[broker_pb2.PublishRecord(value=v) for v in values]))
            end = state.partition(mirror.topic_id, 0).end_offset
            held += [n for _, n in record_log.sizes(state.records_store(mirror.topic_id), mirror.topic_id, 0,
                                                    end - len(values), end)]
        trim()
        st = state.partition(meta.topic_id, 0)
        assert (st.start_offset, st.records, st.bytes) == (first, len(held), sum(held)), (step, caps)
