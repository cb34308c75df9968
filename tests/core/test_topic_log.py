"""TopicLog over the in-memory replicator: validation, placement, idempotency keys, watermarks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.clock import ManualClock
from broker.core import errors
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.partitioning import partition_for_key
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, Placement, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, internal_pb2
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def log(clock: ManualClock) -> Iterator[TopicLog]:
    state = BrokerStateMachine(MemoryStore(), Changes())
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    topic_log = TopicLog(state, submitter, Limits(record_bytes_max=1000, batch_bytes_max=5000), "c/n1", clock)
    topic_log.create_topic(internal_pb2.TopicConfig(name="t", partitions=4))
    yield topic_log
    replicator.close()


def pub(log: TopicLog, *records: broker_pb2.PublishRecord, dedup_id: str = "") -> list[Placement]:
    return list(log.publish(publish_request(topic="t", records=records, dedup_id=dedup_id)))


def ends(log: TopicLog) -> list[int]:
    return [p.end_offset for p in log.describe_topic("t").partitions]


def test_placement_explicit_then_key_then_round_robin(log: TopicLog) -> None:
    res = pub(log, broker_pb2.PublishRecord(value=b"a", partition=3), broker_pb2.PublishRecord(value=b"b", key=b"k"),
              *[broker_pb2.PublishRecord(value=b"c") for _ in range(4)])
    assert res[0].partition == 3
    assert res[1].partition == partition_for_key(b"k", 4)
    assert sorted(r.partition for r in res[2:]) == [0, 1, 2, 3]


def test_limits_are_checked_before_anything_is_stored(log: TopicLog) -> None:
    with pytest.raises(errors.InvalidArgument, match="record 1 is"):
        pub(log, broker_pb2.PublishRecord(value=b"ok"), broker_pb2.PublishRecord(value=b"x" * 2000))
    with pytest.raises(errors.InvalidArgument, match="batch of"):
        pub(log, *[broker_pb2.PublishRecord(value=b"x" * 900) for _ in range(6)])
    assert ends(log) == [0, 0, 0, 0]


def test_idempotency_key_repeat_returns_the_original_place(log: TopicLog) -> None:
    first = pub(log, broker_pb2.PublishRecord(value=b"a", idempotency_key="k1"))[0]
    again = pub(log, broker_pb2.PublishRecord(value=b"a", idempotency_key="k1"),
                broker_pb2.PublishRecord(value=b"b", idempotency_key="k2"),
                broker_pb2.PublishRecord(value=b"b", idempotency_key="k2"))
    assert (again[0].partition, again[0].offset, again[0].duplicate) == (first.partition, first.offset, True)
    assert not again[1].duplicate and again[2].duplicate and again[2].offset == again[1].offset
    assert sum(ends(log)) == 2


def test_idempotency_window_expires(log: TopicLog, clock: ManualClock) -> None:
    pub(log, broker_pb2.PublishRecord(value=b"a", idempotency_key="k"))
    clock.advance(120_001)  # past the default 2-minute window
    assert not pub(log, broker_pb2.PublishRecord(value=b"a", idempotency_key="k"))[0].duplicate
    log.expire_dedup()
    clock.advance(1)
    assert pub(log, broker_pb2.PublishRecord(value=b"a", idempotency_key="k"))[0].duplicate  # the new copy's key


def test_watermarks_discard_repeats_and_reject_gaps(log: TopicLog) -> None:
    def rec(i: int) -> broker_pb2.PublishRecord:
        return broker_pb2.PublishRecord(value=b"m%d" % abs(i), msg_id=i)

    assert [r.duplicate for r in pub(log, rec(1), rec(-2), rec(3), dedup_id="s")] == [False, False, False]
    # a hot standby replays 2..4: 2 and 3 are duplicates, 4 is new
    assert [r.duplicate for r in pub(log, rec(2), rec(3), rec(4), dedup_id="s")] == [True, True, False]
    with pytest.raises(errors.InvalidArgument, match="breaks the sequence"):
        pub(log, rec(7), dedup_id="s")
    with pytest.raises(errors.InvalidArgument, match="breaks the sequence"):
        pub(log, rec(5), rec(-5), dedup_id="s")
    with pytest.raises(errors.InvalidArgument, match="needs a dedup_id"):
        pub(log, rec(5))
    assert log.watermarks("t") == [("s", 4)]
    assert sum(ends(log)) == 4
    assert log.reset_watermark("t", "s") is True
    assert log.watermarks("t") == []
    assert log.reset_watermark("t", "s") is False, "nothing left to reset"
    with pytest.raises(errors.InvalidArgument, match="longer than"):
        log.reset_watermark("t", "s" * 10_000)  # refused on the leader, not replicated
    assert not pub(log, rec(1), dedup_id="s")[0].duplicate
