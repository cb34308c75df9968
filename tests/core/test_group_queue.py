"""Queue-mode delivery on the leader: leases, ack/nack/extend/discard, expiry, backoff, dead letters,
ordered keys and a leadership change (unit: real core over MemoryStore and InMemoryReplicator)."""

from __future__ import annotations

import pytest

from broker.core import formats, records
from broker.core.errors import InvalidArgument
from broker.core.groups import layout
from broker.core.groups.apply import DeadRetried
from broker.v1 import internal_pb2
from tests.core.groups_env import make_env, positions, values

pytestmark = pytest.mark.unit
QUEUE = internal_pb2.DELIVERY_MODE_QUEUE


def test_two_groups_each_get_every_record_and_a_group_shares_them_out() -> None:
    env = make_env()
    env.topic("t", 3)
    env.publish("t", [b"%d" % i for i in range(30)])
    a, b = env.group("t", "a"), env.group("t", "b")
    got_a = values(env.pick(a, a.open_stream(), 100))
    s1, s2 = b.open_stream(), b.open_stream()
    first, second = env.pick(b, s1, 10), env.pick(b, s2, 100)
    assert sorted(got_a) == sorted(b"%d" % i for i in range(30))
    assert len(first.records) == 10 and len(second.records) == 20
    assert not set(values(first)) & set(values(second)), "no record leased to two streams of one group"
    assert not env.pick(b, s1, 100).records, "everything is leased"


def test_acks_settle_and_move_the_watermark_nacks_redeliver_after_the_backoff() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c"])
    rt = env.group("t", "g", base_delay_ms=1000, max_delay_ms=8000)
    s = rt.open_stream()
    d = env.pick(rt, s)
    assert [r.delivery_attempt for r in d.records] == [1, 1, 1]
    tokens = positions(d)
    assert env.service.ack("t", "g", [tokens[0], tokens[2]]) == 2
    env.service.nack("t", "g", [tokens[1]], 0, release=False)
    rt.refresh()
    assert rt.cursor(0).committed == 1 and rt.cursor(0).ranges == [(2, 3)]
    assert not env.pick(rt, s).records, "the retry is not due before the backoff"
    env.clock.advance(999)
    assert not env.pick(rt, s).records
    env.clock.advance(1)
    again = env.pick(rt, s)
    assert values(again) == [b"b"] and again.records[0].delivery_attempt == 2
    env.service.ack("t", "g", positions(again))
    rt.refresh()
    assert rt.cursor(0).committed == 3 and rt.cursor(0).retrying == 0


def test_an_ack_answers_per_position_which_records_it_settled() -> None:
    """``ack_each`` (what ``AckResponse.not_settled`` is built from): a record settled before, a
    repeat within the call and a token of an older incarnation of the topic are not settled by it."""
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c"])
    rt = env.group("t", "g")
    tokens = positions(env.pick(rt, rt.open_stream()))
    old = env.state.topic("t")
    assert old is not None
    stale = records.position_token(old.topic_id + 1000, 0, 1)
    assert env.service.ack_each("t", "g", [tokens[0]]) == [True]
    assert env.service.ack_each("t", "g", [tokens[1], tokens[0], stale, tokens[1], tokens[2]]) == [
        True, False, False, False, True]
    assert env.service.ack("t", "g", tokens) == 0, "all settled before"


def test_expired_lease_is_redelivered_and_extend_keeps_it() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"x", b"y"])
    rt = env.group("t", "g", visibility_timeout_ms=1000, base_delay_ms=100)
    s = rt.open_stream()
    d = env.pick(rt, s)
    env.clock.advance(800)
    assert env.service.extend("t", "g", [d.records[0].position], 0) == [env.clock.now_ms() + 1000]
    env.clock.advance(300)
    env.service.tick()  # y expired (deadline 1000), x was extended to 1800
    rt.refresh()
    assert [(p, o) for p, o, _ in layout.retries(env.state.store, rt.gid)] == [(0, 1)]
    env.clock.advance(100)
    redelivered = env.pick(rt, rt.open_stream())
    assert values(redelivered) == [b"y"] and redelivered.records[0].delivery_attempt == 2
    env.clock.advance(1000)
    env.service.tick()
    rt.refresh()
    assert rt.cursor(0).retrying == 2, "x expired later, y expired again"


def test_always_failing_record_goes_to_dead_letters_then_retry_brings_it_back() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"poison"], key=b"k")
    rt = env.group("t", "g", max_attempts=3, base_delay_ms=100, max_delay_ms=1000)
    s = rt.open_stream()
    delivered_at = []
    for _ in range(3):
        d = env.pick(rt, s)
        while not d.records:
            env.clock.advance(10)
            d = env.pick(rt, s)
        delivered_at.append(env.clock.now_ms())
        env.service.nack("t", "g", positions(d), 0, release=False)
    assert [b - a for a, b in zip(delivered_at, delivered_at[1:], strict=False)] == [100, 200]
    lag = env.ops.lag("t", "g").partitions[0]
    assert (lag.lag, lag.retrying, lag.dead, lag.committed) == (0, 0, 1, 1)
    [dead] = env.ops.dead_letters("t", "g", 0, None, None)
    assert dead.attempts == 3 and dead.record.value == b"poison"
    assert dead.record.topic == "t.g.dlq" and dead.record.headers["dlq.offset"] == "0"
    assert env.ops.retry_dead_letters("t", "g", [(0, 0)], False) == DeadRetried(1, 0)
    back = env.pick(rt, s)
    assert values(back) == [b"poison"] and back.records[0].delivery_attempt == 1
    env.service.ack("t", "g", positions(back))
    lag = env.ops.lag("t", "g").partitions[0]
    assert (lag.lag, lag.retrying, lag.dead) == (0, 0, 0)


def test_discard_goes_straight_to_dead_letters_and_release_redelivers_at_once() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b"])
    rt = env.group("t", "g")
    s = rt.open_stream()
    d = env.pick(rt, s)
    env.service.discard("t", "g", [d.records[0].position], "bad payload")
    env.service.nack("t", "g", [d.records[1].position], 0, release=True)
    again = env.pick(rt, s)
    assert values(again) == [b"b"] and again.records[0].delivery_attempt == 1
    [dead] = env.ops.dead_letters("t", "g", 0, None, None)
    assert dead.reason == "discarded: bad payload" and dead.attempts == 1


def test_ordered_keeps_one_lease_per_key_in_flight_and_order_per_key() -> None:
    env = make_env()
    env.topic("t", 2)
    for i in range(4):
        env.publish("t", [b"a%d" % i], key=b"A")
        env.publish("t", [b"b%d" % i], key=b"B")
    env.publish("t", [b"n0", b"n1"])
    rt = env.group("t", "g", ordered=True, base_delay_ms=50)
    s1, s2 = rt.open_stream(), rt.open_stream()
    first = env.pick(rt, s1)
    assert sorted(values(first)) == [b"a0", b"b0", b"n0", b"n1"]
    assert not env.pick(rt, s2).records, "A and B are busy"
    a0 = next(r for r in first.records if r.value == b"a0")
    env.service.nack("t", "g", [a0.position], 0, release=False)
    assert not env.pick(rt, s2).records, "A stays blocked while a0 waits for its retry"
    env.clock.advance(50)
    assert values(env.pick(rt, s2)) == [b"a0"]
    seen: dict[bytes, list[bytes]] = {b"A": [], b"B": []}
    stream = s1
    for _ in range(20):
        d = env.pick(rt, stream)
        for r in d.records:
            if r.key in seen:
                seen[r.key].append(r.value)
        env.service.ack("t", "g", positions(d) + [r.position for r in first.records])
        stream = s2 if stream == s1 else s1
    assert seen[b"A"] == [b"a1", b"a2", b"a3"] and seen[b"B"] == [b"b1", b"b2", b"b3"]


def test_a_new_leader_redelivers_in_flight_records_and_never_settled_ones() -> None:
    env = make_env()
    env.topic("t", 2)
    env.publish("t", [b"%d" % i for i in range(10)])
    rt = env.group("t", "g")
    d = env.pick(rt, rt.open_stream())
    acked = {r.value for r in d.records[:6]}
    env.service.ack("t", "g", [r.position for r in d.records[:6]])
    rt.refresh()
    before = [rt.cursor(p).committed for p in (0, 1)]
    assert sum(before) > 0
    env.restart_leadership()
    rt2 = env.service.runtime("t", "g")
    assert rt2 is not rt
    redelivered = env.pick(rt2, rt2.open_stream())
    assert set(values(redelivered)) == {b"%d" % i for i in range(10)} - acked
    assert [rt2.cursor(p).committed for p in (0, 1)] == before


def test_paused_group_receives_nothing_until_resumed() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a"])
    rt = env.group("t", "g")
    env.group("t", "h")
    assert env.ops.pause("t", "", True) == ["g", "h"]
    s = rt.open_stream()
    assert not env.pick(rt, s).records
    assert env.ops.pause("t", "g", False) == ["g"]
    assert values(env.pick(rt, s)) == [b"a"]


def test_an_idle_stream_waits_for_retries_not_yet_due_not_for_one_in_flight() -> None:
    """A retried record that is leased again is due already: an idle stream must not wake for it
    every millisecond (it wakes when the lease is settled or expires, both state changes)."""
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b"])
    rt = env.group("t", "g", base_delay_ms=1000, max_delay_ms=1000)
    s = rt.open_stream()
    first = env.pick(rt, s)
    env.service.nack("t", "g", positions(first), 0, release=False)
    rt.refresh()
    assert rt.next_due_ms("m", env.clock.now_ms()) == env.clock.now_ms() + 1000
    env.clock.advance(1000)
    again = env.pick(rt, s)
    assert sorted(values(again)) == [b"a", b"b"], "both retries delivered again"
    assert rt.next_due_ms("m", env.clock.now_ms()) is None, "both are in flight: nothing to wait for"
    env.service.nack("t", "g", positions(again)[:1], 500, release=False)
    rt.refresh()
    assert rt.next_due_ms("m", env.clock.now_ms()) == env.clock.now_ms() + 500


def test_due_retries_are_read_together_and_a_pruned_one_is_reported_not_delivered() -> None:
    """Retries spread over two partitions, near and far apart (several range reads), some pruned
    while they waited: every stored one is delivered again in position order, every pruned one is
    reported (by the gap's SKIP_FORWARD: nothing is wrong with the store, so no BADMSG) and
    dead-lettered, its failures on record, and the budget is kept."""
    env = make_env()
    env.topic("t", 2)
    env.publish("t", [b"p0-%d" % i for i in range(300)], partition=0)
    env.publish("t", [b"p1-%d" % i for i in range(10)], partition=1)
    rt = env.group("t", "g", base_delay_ms=100, max_delay_ms=100)
    s = rt.open_stream()
    first = env.pick(rt, s, 1000)
    chosen = [r for r in first.records if r.partition == 1 or r.offset in (0, 1, 2, 150, 151, 299)]
    env.service.ack("t", "g", [r.position for r in first.records if r not in chosen])
    env.service.nack("t", "g", [r.position for r in chosen], 0, release=False)
    env.log.prune("t", 0, 2)  # offsets 0 and 1 of partition 0 go while they wait
    env.clock.advance(100)
    again = env.pick(rt, s, 5)
    assert [(r.partition, r.offset) for r in again.records] == [(0, 2), (0, 150), (0, 151), (0, 299), (1, 0)]
    events = [(e.type, e.partition, e.offset_before, e.offset_after) for e in again.events]
    assert events == [(internal_pb2.EVENT_TYPE_SKIP_FORWARD, 0, 0, 2)], "the pruned retries are reported"
    assert [(b.partition, b.offset, b.reason) for b in again.bad] == [(0, 0, "pruned before its retry"),
                                                                     (0, 1, "pruned before its retry")]
    assert env.ops.lag("t", "g").partitions[0].dead == 2
    rest = env.pick(rt, s, 100)
    assert [(r.partition, r.offset) for r in rest.records] == [(1, o) for o in range(1, 10)]
    assert all(r.delivery_attempt == 2 for r in again.records + rest.records)


@pytest.mark.parametrize("cluster_format", [formats.PRUNED_DEAD_FORMAT - 1, formats.PRUNED_DEAD_FORMAT])
def test_a_retry_of_dead_letters_leaves_those_whose_records_were_pruned_dead(cluster_format: int) -> None:
    """Dead letters at offsets 0, 1 (pruned since) and 3 (retained): a retry, named or of all,
    sends back offset 3 alone and counts the two apart; they stay listed. Before format 3 the
    command carries no cut and every one goes back (and dies again, pruned before its retry)."""
    env = make_env()
    env.replicator.submit(formats.set_format_command(cluster_format).SerializeToString(), lambda *_: None)
    env.topic("t")
    env.publish("t", [b"v%d" % i for i in range(5)], partition=0)
    rt = env.group("t", "g")
    s = rt.open_stream()
    first = env.pick(rt, s, 5)
    dead = [r.position for r in first.records if r.offset in (0, 1, 3)]
    env.service.discard("t", "g", dead, "bad")
    env.service.ack("t", "g", [r.position for r in first.records if r.offset in (2, 4)])
    env.log.prune("t", 0, 2)
    assert [d.offset for d in env.ops.dead_letters("t", "g", 0, None, None)] == [0, 1, 3]
    if cluster_format < formats.PRUNED_DEAD_FORMAT:
        assert env.ops.retry_dead_letters("t", "g", [(0, 0), (0, 3)], False) == DeadRetried(2, 0)
        return
    assert env.ops.retry_dead_letters("t", "g", [(0, 0), (0, 3), (0, 9)], False) == DeadRetried(1, 1)
    assert [d.offset for d in env.ops.dead_letters("t", "g", 0, None, None)] == [0, 1]
    assert env.ops.retry_dead_letters("t", "g", [], True) == DeadRetried(0, 2)
    back = env.pick(rt, s, 5)
    assert [(r.offset, r.value) for r in back.records] == [(3, b"v3")] and not back.bad
    assert env.ops.lag("t", "g").partitions[0].dead == 2


def test_a_nack_after_the_lease_ran_out_counts_no_second_failed_attempt() -> None:
    """The expiry counted the delivery's failure; a late nack of it changes nothing (it made one
    delivery two failed attempts: dead-lettered as "attempt 2 of 2" after one delivery). A nack of
    the record's next delivery counts as usual."""
    env = make_env()
    env.topic("t")
    env.publish("t", [b"x"])
    rt = env.group("t", "g", visibility_timeout_ms=1000, base_delay_ms=5000, max_delay_ms=5000, max_attempts=2)
    s = rt.open_stream()
    first = env.pick(rt, s)
    env.clock.advance(1001)
    env.service.tick()
    rt.refresh()
    due = rt.retry_state((0, 0))
    assert due is not None and due.attempts == 1
    env.service.nack("t", "g", positions(first), 0, release=False)
    rt.refresh()
    assert rt.retry_state((0, 0)) == due, "the late nack changed nothing"
    assert env.ops.dead_letters("t", "g", 0, None, None) == []
    env.clock.advance(5000)
    again = env.pick(rt, s)
    assert [r.delivery_attempt for r in again.records] == [2]
    env.service.nack("t", "g", positions(again), 0, release=False)
    [dead] = env.ops.dead_letters("t", "g", 0, None, None)
    assert dead.attempts == 2 and dead.reason == "nacked (attempt 2 of 2)"


def test_a_nack_while_the_expiry_is_being_replicated_counts_no_second_failed_attempt() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"x"])
    rt = env.group("t", "g", visibility_timeout_ms=1000, max_attempts=3)
    first = env.pick(rt, rt.open_stream())
    env.clock.advance(1001)
    expired = rt.take_expired(env.clock.monotonic_ms())  # the ticker's first step: marked, not applied yet
    assert [lease.position for lease in expired] == [(0, 0)]
    env.service.nack("t", "g", positions(first), 0, release=False)
    rt.refresh()
    assert rt.retry_state((0, 0)) is None, "left to the expiry"


def test_extend_answers_one_deadline_per_token_also_for_a_token_of_an_older_incarnation() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a"])
    rt = env.group("t", "g", visibility_timeout_ms=1000)
    [token] = positions(env.pick(rt, rt.open_stream()))
    old = env.state.topic("t")
    assert old is not None
    stale = records.position_token(old.topic_id + 1000, 0, 1)
    assert env.service.extend("t", "g", [stale, token], 500) == [0, env.clock.now_ms() + 500]


def test_a_position_past_the_partition_end_is_refused_and_changes_nothing() -> None:
    """Before: an ack of a forged receipt past the end settled the offset ahead (the record was never
    delivered once written: silent loss), a nack made a retry and a discard a dead letter of a record
    that did not exist."""
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a"])
    rt = env.group("t", "g")
    [token] = positions(env.pick(rt, rt.open_stream()))
    meta = env.state.topic("t")
    assert meta is not None
    ahead = records.position_token(meta.topic_id, 0, 2)  # offset 1: the next record, not written yet
    with pytest.raises(InvalidArgument, match=r"position 1 \(partition 0 offset 1\) .* ends at offset 1"):
        env.service.ack_each("t", "g", [token, ahead])
    with pytest.raises(InvalidArgument, match="ends at offset 1"):
        env.service.nack("t", "g", [ahead], 0, release=False)
    with pytest.raises(InvalidArgument, match="ends at offset 1"):
        env.service.discard("t", "g", [ahead], "x")
    rt.refresh()
    assert rt.cursor(0).committed == 0 and rt.cursor(0).ranges == [] and rt.retry_state((0, 1)) is None
    assert env.ops.dead_letters("t", "g", 0, None, None) == []
    env.publish("t", [b"b"])
    assert env.service.ack_each("t", "g", [token]) == [True]
    assert values(env.pick(rt, rt.open_stream())) == [b"b"], "the next record is delivered"


def _at_format(env: object, cluster_format: int) -> None:
    env.replicator.submit(formats.set_format_command(cluster_format).SerializeToString(),  # type: ignore[attr-defined]
                          lambda *_: None)


def test_a_late_nack_release_or_extend_of_an_earlier_delivery_leaves_the_next_delivery_alone() -> None:
    """A consumer whose lease ran out while it worked nacks, releases or extends the record after it was
    delivered again. Before delivery tokens its nack failed the second delivery while its holder worked
    on it (dead-lettered here, max_attempts 2: "attempt 2 of 2" though the holder then acked it), its
    release handed the record to a third consumer, and its extend lengthened the other's lease."""
    env = make_env()
    _at_format(env, formats.DELIVERY_TOKEN_FORMAT)
    env.topic("t")
    env.publish("t", [b"x"])
    rt = env.group("t", "g", visibility_timeout_ms=1000, base_delay_ms=10, max_delay_ms=10, max_attempts=2)
    slow, next_holder = rt.open_stream(), rt.open_stream()
    [stale] = positions(env.pick(rt, slow))
    env.clock.advance(1001)
    env.service.tick()  # the first delivery's lease runs out: one failed attempt
    env.clock.advance(10)
    again = env.pick(rt, next_holder)
    [current] = positions(again)
    assert [r.delivery_attempt for r in again.records] == [2]
    assert stale != current and records.PositionToken.decode(stale).delivery != records.PositionToken.decode(
        current).delivery
    assert env.service.extend("t", "g", [stale, current], 500) == [0, env.clock.now_ms() + 500]
    env.service.nack("t", "g", [stale], 0, release=False)
    env.service.nack("t", "g", [stale], 0, release=True)
    rt.refresh()
    assert rt.leases.get((0, 0)) is not None and rt.leases.get((0, 0)).delivery == records.PositionToken.decode(  # type: ignore[union-attr]
        current).delivery, "the next delivery still holds its lease"
    assert env.ops.dead_letters("t", "g", 0, None, None) == []
    assert not env.pick(rt, rt.open_stream()).records, "nothing handed to a third consumer"
    assert env.service.ack_each("t", "g", [current]) == [True]
    assert env.ops.lag("t", "g").partitions[0].lag == 0


def test_an_ack_or_discard_of_an_earlier_delivery_still_settles_the_record() -> None:
    """The record was processed: a late ack settles it, whichever delivery holds it now (at-least-once)."""
    env = make_env()
    _at_format(env, formats.DELIVERY_TOKEN_FORMAT)
    env.topic("t")
    env.publish("t", [b"x", b"y"])
    rt = env.group("t", "g", visibility_timeout_ms=1000, base_delay_ms=10, max_delay_ms=10)
    slow = rt.open_stream()
    stale = positions(env.pick(rt, slow, 2))
    env.clock.advance(1001)
    env.service.tick()
    env.clock.advance(10)
    assert len(env.pick(rt, rt.open_stream(), 2).records) == 2
    assert env.service.ack_each("t", "g", stale[:1]) == [True]
    env.service.discard("t", "g", stale[1:], "poison")
    [dead] = env.ops.dead_letters("t", "g", 0, None, None)
    assert dead.offset == 1 and dead.reason == "discarded: poison"
    assert env.ops.lag("t", "g").partitions[0].lag == 0


@pytest.mark.parametrize("cluster_format", [formats.DELIVERY_TOKEN_FORMAT - 1, formats.DELIVERY_TOKEN_FORMAT])
def test_delivery_tokens_are_handed_out_only_once_every_member_reads_them(cluster_format: int) -> None:
    """Code before format 4 refuses a token of version 2 (its length): a leader hands them out only from
    the cluster format that says every member's code reads them; before, deliveries carry version 1."""
    env = make_env()
    _at_format(env, cluster_format)
    env.topic("t")
    env.publish("t", [b"x"])
    rt = env.group("t", "g")
    [token] = positions(env.pick(rt, rt.open_stream()))
    decoded = records.PositionToken.decode(token)
    assert (decoded.delivery != 0) == (cluster_format >= formats.DELIVERY_TOKEN_FORMAT)
    assert len(token) == (25 if decoded.delivery else 17)
    assert env.service.ack_each("t", "g", [token]) == [True]
