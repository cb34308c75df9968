"""A restarted node takes back the `memory` records it lost from another node's copy
(``BrokerStateMachine.refill``, docs/design/memory-topics.md "Taking the records back"): in chunks
that end just below what it holds, each record checked against its skeleton, with cuts that
happened meanwhile left out, and readers never shown a gap."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.core import formats, record_log
from broker.core.state_machine import BrokerStateMachine
from broker.services.memory_refill import HOLD_TRIES_MAX, MemoryRefill, body_of
from broker.storage.memory import MemoryStore
from broker.v1 import common_pb2, internal_pb2
from tests.core.test_memory_restart import MEMORY, Leader, machine, read
from tests.replication.cluster import free_port

pytestmark = pytest.mark.unit

Entry = tuple[int, int, bytes]


@pytest.fixture
def lead() -> Iterator[Leader]:
    """A leader at the newest command format with a `memory` topic "m" of one partition."""
    leader = Leader()
    try:
        leader.submitter.submit(formats.set_format_command(formats.CODE_FORMAT))
        leader.log.create_topic(internal_pb2.TopicConfig(name="m", durability=MEMORY))
        yield leader
    finally:
        leader.replicator.close()


def restarted(lead: Leader) -> BrokerStateMachine:
    """A follower that applied the leader's whole log, then restarted (a new process: no records)."""
    store = MemoryStore()
    follower = machine(store)
    for index, command, _ in lead.tap.log:
        follower.apply(index, command)
    return machine(store)


def held(state: BrokerStateMachine, tid: int, begin: int, end: int) -> list[Entry]:
    """What ``state`` holds of partition 0 in ``[begin, end)``, as another node would send it."""
    return [(e.offset, e.timestamp_ms, e.body)
            for e in record_log.read(state.records_store(tid), tid, 0, begin, end)]


def catch_up(lead: Leader, follower: BrokerStateMachine) -> None:
    for index, command, _ in lead.tap.log:
        follower.apply(index, command)


def test_a_restarted_node_takes_its_records_back_in_chunks_and_readers_see_no_gap(lead: Leader) -> None:
    for i in range(10):
        lead.publish("m", *[b"v%d-%d" % (i, j) for j in range(i + 1)])  # 55 records, ten timestamps' worth
        lead.clock.now += 5
    state = lead.tap.state
    meta = state.topic("m")
    assert meta is not None
    tid = meta.topic_id
    follower = restarted(lead)
    assert follower.lost_at_start(tid, 0) == (0, 55)
    [span] = follower.lost_partitions()
    assert (span.topic, span.first, span.view_start) == ("m", 0, 55)
    assert span.lost_bytes == state.counters(tid, 0).bytes

    lead.publish("m", b"after")  # applied by the restarted node: it holds 55 on
    catch_up(lead, follower)
    assert follower.refill(tid, 0, held(state, tid, 30, 54)) == 0, "a chunk must end just below the view"
    assert follower.refill(tid, 0, held(state, tid, 30, 40) + held(state, tid, 41, 55)) == 0, "nor have a gap"
    assert follower.refill(tid, 0, held(state, tid, 30, 55)) == 25
    assert follower.lost_at_start(tid, 0) == (0, 30)
    view = follower.partition(tid, 0)
    assert (view.start_offset, view.records) == (30, 26)
    assert view.bytes == sum(size for _, size in record_log.sizes(state.records_store(tid), tid, 0, 30, 56))
    events = read(follower, "m")
    assert (events[0].type, events[0].offset_before, events[0].offset_after) == (
        common_pb2.EVENT_TYPE_SKIP_FORWARD, 0, 30), "what is still lost is said"
    assert follower.refill(tid, 0, held(state, tid, 0, 30)) == 30
    assert follower.lost_at_start(tid, 0) is None and follower.lost_partitions() == []
    assert follower.partition(tid, 0) == state.counters(tid, 0), "the view is the counters again"
    assert [(r.offset, r.value, r.timestamp_ms) for r in read(follower, "m")] == \
        [(r.offset, r.value, r.timestamp_ms) for r in read(state, "m")]
    assert follower.refilled_records == 55


def test_a_record_that_differs_from_its_skeleton_is_not_taken(lead: Leader) -> None:
    lead.publish("m", b"a", b"bb", b"ccc")
    state = lead.tap.state
    meta = state.topic("m")
    assert meta is not None
    tid = meta.topic_id
    follower = restarted(lead)
    good = held(state, tid, 0, 3)
    wrong_size = [*good[:2], (2, good[2][1], good[2][2] + b"x")]
    wrong_time = [(0, good[0][1] + 1, good[0][2]), *good[1:]]
    assert follower.refill(tid, 0, wrong_size) == 0
    assert follower.refill(tid, 0, wrong_time) == 0
    assert follower.lost_at_start(tid, 0) == (0, 3)
    assert follower.refill(tid, 0, good) == 3


def test_records_cut_meanwhile_are_left_out_and_a_cut_past_the_loss_ends_it(lead: Leader) -> None:
    lead.publish("m", *[b"r%02d" % i for i in range(20)])
    state = lead.tap.state
    meta = state.topic("m")
    assert meta is not None
    tid = meta.topic_id
    follower = restarted(lead)
    chunk = held(state, tid, 0, 20)  # read from the other node before the prune
    assert lead.log.prune("m", 0, 8) == 8
    catch_up(lead, follower)
    assert follower.lost_at_start(tid, 0) == (8, 20)
    assert follower.refill(tid, 0, chunk) == 12, "the pruned ones are left out"
    assert follower.partition(tid, 0) == state.counters(tid, 0)
    assert [r.offset for r in read(follower, "m")] == list(range(8, 20))

    follower = restarted(lead)
    lead.publish("m", b"late")
    assert lead.log.prune("m", 0, 20) == 12
    catch_up(lead, follower)
    assert follower.lost_partitions() == [], "nothing it lost is left to take back"
    assert follower.refill(tid, 0, held(state, tid, 20, 21)) == 0


def test_before_format_5_nothing_is_taken_back() -> None:
    """No skeletons to check a record against, and the counters follow the view then."""
    lead = Leader()
    try:
        lead.submitter.submit(formats.set_format_command(formats.MEMORY_SKELETON_FORMAT - 1))
        lead.log.create_topic(internal_pb2.TopicConfig(name="m", durability=MEMORY))
        lead.publish("m", b"a", b"b")
        meta = lead.tap.state.topic("m")
        assert meta is not None
        follower = restarted(lead)
        assert follower.lost_partitions() == []
        assert follower.refill(meta.topic_id, 0, held(lead.tap.state, meta.topic_id, 0, 2)) == 0
    finally:
        lead.replicator.close()


def test_a_record_sent_back_keeps_its_stored_body() -> None:
    body = internal_pb2.RecordBody(key=b"k", value=b"v", headers={"h": "1"}, producer="p", msg_id="m")
    record = common_pb2.Record()
    record.MergeFromString(body.SerializeToString())
    record.topic, record.partition, record.offset, record.timestamp_ms = "t", 3, 9, 77
    record.position, record.delivery_attempt = b"pos", 2
    assert body_of(record) == body.SerializeToString()


def test_a_journal_that_ended_in_uncommitted_entries_replays_only_what_it_keeps(lead: Leader) -> None:
    """A node cut off as leader held appends nobody committed; the new leader's log replaced them.
    It counted itself replaying up to its old journal end, took nothing back and was not ready
    until the cluster's log grew past it (audit: 45 s here, hours on an idle cluster)."""
    lead.publish("m", b"a", b"b")
    store = MemoryStore()
    follower = machine(store)
    for index, command, _ in lead.tap.log:
        follower.apply(index, command)
    follower = machine(store)
    last = lead.tap.log[-1][0]
    follower.journal_opened(last + 40)  # 40 entries it held that were never committed
    assert follower.replaying
    follower.journal_truncated(last + 1)  # the new leader's log replaced them
    assert not follower.replaying
    assert [s.view_start for s in follower.lost_partitions()] == [2]
    assert follower.lost_records() == 2


def test_a_chunk_is_bounded_by_its_records_sizes(lead: Leader) -> None:
    """The sizes come from the skeletons: a burst of large records among small ones makes a short
    chunk (the lost span's average made a 600 MB one in an audit), and a chunk holds at least one."""
    lead.publish("m", *[b"s"] * 1000)  # 0..999: 1 byte each
    lead.publish("m", *[b"L" * 1000] * 10)  # 1000..1009: 1,000 bytes each
    follower = restarted(lead)
    [span] = follower.lost_partitions()
    assert (span.first, span.view_start) == (0, 1010)
    tid = span.topic_id
    sizes = [size for _, size in record_log.sizes(lead.tap.state.records_store(tid), tid, 0, 0, 1010)]
    large = sizes[-1]
    assert large > 1000 and set(sizes[1000:]) == {large}
    assert follower.refill_chunk_start(span, large * 3 + large // 2, 20_000) == 1007, "three large ones"
    assert follower.refill_chunk_start(span, 10, 20_000) == 1009, "at least one"
    assert follower.refill_chunk_start(span, large * 10 + sum(sizes[900:1000]), 20_000) == 900, \
        "ten large, then 100 small"
    assert follower.refill_chunk_start(span, 10**9, 20_000) == 0, "no further than what was lost"
    assert follower.refill_chunk_start(span, 10**9, 5) == 1005, "at most the records asked"


def test_while_the_journal_replays_nothing_is_taken_back(lead: Leader) -> None:
    """A replayed append moves the view to the end again: a chunk taken before it stayed in memory,
    and a later take split the same offsets differently, so readers got records twice (audit)."""
    for i in range(6):
        lead.publish("m", *[b"r%d-%d" % (i, j) for j in range(500)])
    state = lead.tap.state
    log = lead.tap.log
    store = MemoryStore()
    follower = machine(store)
    half = len(log) - 3
    for index, command, _ in log[:half]:
        follower.apply(index, command)
    follower = machine(store)  # restarted: its store is at `half`, its journal holds all
    follower.journal_opened(log[-1][0])
    tid, _ = _partition(follower)
    assert follower.replaying and follower.lost_partitions() == []
    refill = MemoryRefill(follower, list)
    assert refill.pending(), "not ready while it replays"
    assert follower.refill(tid, 0, held(state, tid, 1000, follower.partition(tid, 0).start_offset)) == 0
    for index, command, _ in log[half:]:
        follower.apply(index, command)
    assert not follower.replaying
    [span] = follower.lost_partitions()
    assert (span.first, span.view_start) == (0, 3000)
    assert follower.refill(tid, 0, held(state, tid, 1500, 3000)) == 1500
    assert follower.refill(tid, 0, held(state, tid, 0, 1500)) == 1500
    assert [(r.offset, r.value) for r in read(follower, "m")] == [(r.offset, r.value) for r in read(state, "m")]


def test_records_no_other_node_can_give_do_not_hold_the_node_back(lead: Leader) -> None:
    """``MemoryRefill.pending`` (a follower is not ready while it holds): true until each lost span
    was asked for; a span that no node gave (none answers here) no longer holds it, the next one
    does again. A leader's groups (``held``) wait longer for a span no member could be reached for:
    until HOLD_TRIES_MAX tries in a row reached nobody (an audit: one member that hung for a moment
    made a group skip 300 records the leader took back a second later)."""
    lead.publish("m", b"a", b"b")
    follower = restarted(lead)
    asked: list[int] = []

    def nobody() -> list[str]:
        asked.append(1)
        return [f"127.0.0.1:{free_port()}"]

    refill = MemoryRefill(follower, nobody)
    tid, _ = _partition(follower)
    try:
        assert refill.pending()
        assert refill.held(tid) == {0}, "a leader's groups wait for the records"
        assert refill.refill_all() == 0
        assert not refill.pending(), "nobody could give them: it is not held back"
        assert refill.held(tid) == {0}, "the groups wait on: a member that could not be reached may answer next"
        assert follower.lost_at_start(*_partition(follower)) == (0, 2)
        assert len(asked) == 1
        refill.refill_all()
        assert len(asked) == 1, "a stalled span is asked for again only later (1 s, then 2, 4 ... 60)"
        [span] = follower.lost_partitions()
        for _ in range(HOLD_TRIES_MAX - 2):
            assert refill._refill(span) == 0  # the tries its thread makes 1, 2, 4 s apart
            assert refill.held(tid) == {0}
        assert refill._refill(span) == 0
        assert refill.held(tid) == frozenset(), f"{HOLD_TRIES_MAX} tries in a row reached nobody: they are told"
    finally:
        refill.stop()


def _partition(state: BrokerStateMachine) -> tuple[int, int]:
    meta = state.topic("m")
    assert meta is not None
    return meta.topic_id, 0
