"""What a group's settles do to its streams (unit: the real stream steps over the real core,
MemoryStore and InMemoryReplicator).

- A settle's apply wakes the streams before the leader forgets the settled leases; a stream that
  picked in between (no room, its key still leased) must be woken again once they are forgotten,
  or it waits for an unrelated change or ``WAKE_S``. Before the fix a consumer acking one message
  at a time got 16 msg/s, one delivery in eight waiting 500 ms (bench/NOTE.md, 2026-12-06). The
  race is made to happen by running the stream's step inside the settle's submit, after its apply.
- Waiting keys' heads and released records are read together; what a pick hands out must not change.
- A settle commits past pruned records only once a client received SKIP_FORWARD: it settled (or
  released) a record its stream delivered after the event (SPEC §3.3).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from broker.leader.groups.runtime import Delivery, GroupRuntime
from broker.leader.reading import Idle, Step
from broker.services import wire
from broker.v1 import broker_pb2, internal_pb2
from tests.core.groups_env import Env, make_env

pytestmark = pytest.mark.unit
QUEUE = internal_pb2.DELIVERY_MODE_QUEUE


def _stream(env: Env, **request: object) -> Iterator[Step]:
    req = broker_pb2.SubscribeRequest(topic="t", group="g", **request)  # type: ignore[arg-type]
    return env.delivery.subscribe_steps(wire.subscription(req), lambda: True)


def _records(step: Step) -> list[bytes]:
    assert isinstance(step, internal_pb2.SubscribeResponse) and step.HasField("batch"), step
    return [r.position for r in step.batch.records]


def _step_inside_the_settle(env: Env, steps: Iterator[Step]) -> list[Step]:
    """Make the next settle run one step of ``steps`` right after its command applied (the stream
    woken by the apply), before the settle returns; returns the list the step lands in."""
    taken: list[Step] = []
    submit: Callable[..., object] = env.service.submit

    def submit_then_step(cmd: internal_pb2.Command, topic: str) -> object:
        result = submit(cmd, topic)
        if cmd.HasField("group_settle") and not taken:
            taken.append(next(steps))
        return result

    env.service.submit = submit_then_step  # type: ignore[method-assign]
    return taken


def test_a_full_stream_is_woken_once_the_acked_lease_is_forgotten() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b"])
    env.group("t", "g", mode=QUEUE)
    steps = _stream(env, max_in_flight=1)
    first = _records(next(steps))
    assert isinstance(next(steps), Idle), "one in flight: the stream waits"
    during = _step_inside_the_settle(env, steps)
    assert env.service.ack("t", "g", first) == 1
    assert len(during) == 1 and isinstance(during[0], Idle), "the pick ran before the lease was forgotten"
    assert env.state.version != during[0].seen_version, "nothing wakes the stream: it would wait for WAKE_S"
    assert len(_records(next(steps))) == 1, "woken, it delivers the second record"


def test_an_ordered_key_is_woken_once_its_acked_lease_is_forgotten() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b"], key=b"k")
    env.group("t", "g", mode=QUEUE, ordered=True)
    steps = _stream(env, max_in_flight=10)
    first = _records(next(steps))
    assert len(first) == 1, "the second record of the key waits for the first"
    assert isinstance(next(steps), Idle)
    during = _step_inside_the_settle(env, steps)
    assert env.service.ack("t", "g", first) == 1
    assert isinstance(during[0], Idle), "the pick ran while the key was still leased"
    assert env.state.version != during[0].seen_version
    assert len(_records(next(steps))) == 1


def test_a_settle_wakes_the_streams_only_when_a_pick_found_nothing_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c"])
    env.group("t", "g", mode=QUEUE)
    wakes: list[None] = []
    notify = env.state.notify_change

    def counted() -> None:
        wakes.append(None)
        notify()

    monkeypatch.setattr(env.state, "notify_change", counted)
    steps = _stream(env, max_in_flight=1)
    first = _records(next(steps))
    assert isinstance(next(steps), Idle)
    assert env.service.ack("t", "g", first) == 1
    assert wakes == [], "no pick ran during the settle: its apply's own wake is enough"
    second = _records(next(steps))
    assert isinstance(next(steps), Idle)
    _step_inside_the_settle(env, steps)
    assert env.service.ack("t", "g", second) == 1
    assert len(wakes) == 1, "a pick found nothing during the settle: one wake after it"
    assert len(_records(next(steps))) == 1


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_ordered_group_read_in_batches_keeps_one_lease_per_key_and_each_key_in_order(seed: int) -> None:
    """Waiting keys' heads and released records are read together (one range read per run of
    nearby offsets); what a pick hands out must not change: one lease per key, each key's first
    deliveries in offset order, every record acked once."""
    rng = random.Random(seed)
    env = make_env()
    env.topic("t", 2)
    keys = [b"k%d" % i for i in range(5)]
    stored: dict[tuple[int, int], bytes] = {}
    for i in range(300):
        key = rng.choice(keys)
        for position in env.publish("t", [b"v%d" % i], key=key, partition=rng.randrange(2)):
            stored[position] = key
    rt = env.group("t", "g", mode=QUEUE, ordered=True)
    streams = [rt.open_stream(), rt.open_stream()]
    held: dict[bytes, tuple[int, int]] = {}  # position token -> (partition, offset)
    first_seen: dict[bytes, list[tuple[int, int]]] = {k: [] for k in keys}
    acked: set[tuple[int, int]] = set()
    for _ in range(2000):
        if len(acked) == len(stored):
            break
        d = env.pick(rt, rng.choice(streams), rng.randint(1, 8))
        for r in d.records:
            position = (r.partition, r.offset)
            assert position not in acked
            busy = [stored[held_at] for held_at in held.values()]
            assert stored[position] not in busy, "a second lease for a key in flight"
            held[r.position] = position
            if r.delivery_attempt == 1 and position not in first_seen[stored[position]]:
                first_seen[stored[position]].append(position)
        tokens = list(held)
        rng.shuffle(tokens)
        for token in tokens[:rng.randint(0, len(tokens))]:
            if rng.random() < 0.3:
                env.service.nack("t", "g", [token], 0, release=True)
            else:
                assert env.service.ack("t", "g", [token]) == 1
                acked.add(held[token])
            del held[token]
    assert acked == set(stored), "every record acked once"
    for key, seen in first_seen.items():
        for p in (0, 1):
            in_partition = [o for q, o in seen if q == p]
            assert in_partition == sorted(in_partition), f"key {key!r} out of order in partition {p}"


def _a_leased_then_a_and_b_pruned(env: Env) -> tuple[GroupRuntime, int, Delivery]:
    """Topic ``t`` holds a, b, c, d; queue group ``g``'s first stream leased a (its delivery is
    returned), then a (leased) and b (never delivered) were pruned."""
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c", b"d"])
    env.group("t", "g", mode=QUEUE)
    rt = env.service.runtime("t", "g")
    stream = rt.open_stream()
    first = env.pick(rt, stream, 1)
    assert [r.value for r in first.records] == [b"a"]
    env.log.prune("t", 0, 2)
    return rt, stream, first


def test_a_prune_seen_by_no_pick_before_an_ack_is_still_told_with_skip_forward() -> None:
    """An ack settled before any pick saw a prune must not move the watermark past the pruned
    records silently (SPEC §3.3): the next pick tells with SKIP_FORWARD, and only then does a
    settle commit past them. Before the fix the ack's settle committed up to the first retained
    record at once, and the stream went on to later records without an event."""
    env = make_env()
    rt, stream, first = _a_leased_then_a_and_b_pruned(env)
    assert env.service.ack("t", "g", [r.position for r in first.records]) == 1
    d = env.pick(rt, stream, 1)
    skips = [(e.offset_before, e.offset_after) for e in d.events if e.type == internal_pb2.EVENT_TYPE_SKIP_FORWARD]
    assert skips == [(1, 2)], "b's loss is told before any later record"
    assert [r.value for r in d.records] == [b"c"]
    assert env.service.ack("t", "g", [r.position for r in d.records]) == 1
    assert env.ops.lag("t", "g").partitions[0].committed == 3, "told: the settle commits past the gap"
    d = env.pick(rt, stream, 10)
    assert [r.value for r in d.records] == [b"d"] and not d.events, "told once"


def test_acks_after_the_told_stream_ended_commit_past_the_pruned_records() -> None:
    """A stream with ``stop_at_end`` ends once caught up, and the sync SDK's acks often follow: the
    group was told all the same (tests/cluster/test_prune_roles.py drives it through the SDK)."""
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c"])
    env.group("t", "g", mode=QUEUE)
    env.log.prune("t", 0, 2)
    rt = env.service.runtime("t", "g")
    stream = rt.open_stream()
    d = env.pick(rt, stream)
    assert [e.type for e in d.events] == [internal_pb2.EVENT_TYPE_SKIP_FORWARD]
    rt.close_stream(stream)
    assert env.service.ack("t", "g", [r.position for r in d.records]) == 1
    assert env.ops.lag("t", "g").partitions[0].committed == 3


def test_an_ordered_key_whose_waiting_record_was_pruned_is_told_and_goes_on() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c"], key=b"k")
    env.group("t", "g", mode=QUEUE, ordered=True)
    steps = _stream(env, max_in_flight=10)
    first = _records(next(steps))
    assert len(first) == 1, "b and c wait for a"
    assert isinstance(next(steps), Idle)
    env.log.prune("t", 0, 2)  # a and b go; c stays
    assert env.service.ack("t", "g", first) == 1
    told = next(steps)
    assert isinstance(told, internal_pb2.SubscribeResponse) and told.HasField("event")
    assert told.event.type == internal_pb2.EVENT_TYPE_SKIP_FORWARD
    assert (told.event.offset_before, told.event.offset_after) == (1, 2)
    rest: list[internal_pb2.SubscribeResponse] = []
    for step in steps:
        if isinstance(step, Idle):
            break
        assert isinstance(step, internal_pb2.SubscribeResponse)
        rest.append(step)
    assert [r.value for step in rest if step.HasField("batch") for r in step.batch.records] == [b"c"]
    assert not [step for step in rest if step.HasField("event")], "b, waiting for its key, is the event's alone"
    assert env.ops.lag("t", "g").partitions[0].dead == 0


def test_records_given_back_then_pruned_are_the_skip_forwards_alone() -> None:
    """Records a stream took and gave back when it closed, then pruned, are below the gap that
    SKIP_FORWARD reports, like the records nobody was handed: no BADMSG, no dead letter, and the
    gap's commit settles them. Before, each was reported as BADMSG and dead-lettered without a body."""
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c", b"d", b"e"])
    env.group("t", "g", mode=QUEUE)
    rt = env.service.runtime("t", "g")
    first = rt.open_stream()
    taken = env.pick(rt, first, 4, member="early")
    assert env.service.ack("t", "g", [taken.records[0].position]) == 1
    rt.close_stream(first)
    env.service.leave("t", "g", "early")  # b, c and d are given back
    env.log.prune("t", 0, 3)  # a, b and c go
    d = env.pick(rt, rt.open_stream(), 10)
    assert [(e.type, e.offset_before, e.offset_after) for e in d.events] == [
        (internal_pb2.EVENT_TYPE_SKIP_FORWARD, 1, 3)]
    assert [r.value for r in d.records] == [b"d", b"e"] and not d.bad
    assert env.service.ack("t", "g", [r.position for r in d.records]) == 2
    lag = env.ops.lag("t", "g").partitions[0]
    assert (lag.committed, lag.dead) == (5, 0)


def test_an_event_sent_to_a_stream_whose_client_settled_nothing_after_it_is_told_again() -> None:
    """A SKIP_FORWARD sent is not one received: the connection may break right after it. An ack of
    a record leased before the event (here by another member) must not move the watermark past the
    pruned records; the next stream is told again, and the settle of a record it received after
    the event commits past them. Before, the event sent counted as told, and nobody heard of the
    loss (SPEC §3.3)."""
    env = make_env()
    rt, _, held = _a_leased_then_a_and_b_pruned(env)
    lost = rt.open_stream()
    sent = env.pick(rt, lost, 1)
    assert [(e.offset_before, e.offset_after) for e in sent.events] == [(0, 2)]
    assert [r.value for r in sent.records] == [b"c"]
    rt.close_stream(lost)  # its client never read the event, nor settled c
    assert env.service.ack("t", "g", [r.position for r in held.records]) == 1
    assert env.ops.lag("t", "g").partitions[0].committed == 1, "an ack of what was leased before the event: not told"
    env.service.nack("t", "g", [r.position for r in sent.records], 0, True)  # c comes again at once
    again = rt.open_stream()
    d = env.pick(rt, again, 1)
    assert [(e.offset_before, e.offset_after) for e in d.events] == [(1, 2)], "told again"
    assert [r.value for r in d.records] == [b"c"]
    assert env.service.ack("t", "g", [r.position for r in d.records]) == 1
    assert env.ops.lag("t", "g").partitions[0].committed == 3, "received: the settle commits past the gap"


def test_a_record_leased_before_the_event_on_the_same_stream_proves_nothing() -> None:
    """A stream's own earlier lease, acked after its event was sent, does not prove the event
    arrived (the client may ack it without having read further)."""
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c"])
    env.group("t", "g", mode=QUEUE)
    rt = env.service.runtime("t", "g")
    stream = rt.open_stream()
    first = env.pick(rt, stream, 1)
    env.log.prune("t", 0, 2)
    d = env.pick(rt, stream, 1)
    assert [(e.offset_before, e.offset_after) for e in d.events] == [(0, 2)]
    assert env.service.ack("t", "g", [r.position for r in first.records]) == 1
    assert env.ops.lag("t", "g").partitions[0].committed == 1
    again = env.pick(rt, stream, 1)
    assert not again.events and not again.records, "the event sent covers the gap left: not sent again"
    assert env.service.ack("t", "g", [r.position for r in d.records]) == 1
    assert env.ops.lag("t", "g").partitions[0].committed == 3, "c came after the event: received"


def test_an_ack_that_also_commits_past_the_gap_settles_the_pruned_lease_it_names() -> None:
    """One ack of a record leased before a prune (a) and of one received after the event (c): the
    settle commits past the gap, and a was settled by this call all the same, so both answer
    settled. Before, the command's commit ran ahead of its entries and a answered "not settled by
    this call", though no other call had settled it. A repeat in the same call is still a repeat."""
    env = make_env()
    rt, _, held = _a_leased_then_a_and_b_pruned(env)
    told = rt.open_stream()
    d = env.pick(rt, told, 1)
    assert [(e.offset_before, e.offset_after) for e in d.events] == [(0, 2)]
    a, c = held.records[0].position, d.records[0].position
    assert env.service.ack_each("t", "g", [a, c, a]) == [True, True, False]
    assert env.ops.lag("t", "g").partitions[0].committed == 3
    assert env.service.ack_each("t", "g", [a, c]) == [False, False], "settled before"


def test_a_release_of_what_followed_the_event_proves_it_arrived() -> None:
    """A client that releases a lease its stream got after SKIP_FORWARD (a nack with ``release``)
    held that record, so it read the event before it: the next settle commits past the gap.
    Before, only an ack, nack or discard counted, and the next stream was told again."""
    env = make_env()
    rt, _, held = _a_leased_then_a_and_b_pruned(env)
    d = env.pick(rt, rt.open_stream(), 1)
    assert [(e.offset_before, e.offset_after) for e in d.events] == [(0, 2)]
    env.service.nack("t", "g", [r.position for r in d.records], 0, True)
    assert env.service.ack("t", "g", [r.position for r in held.records]) == 1
    assert env.ops.lag("t", "g").partitions[0].committed == 2, "past the gap; c is open again"
    again = env.pick(rt, rt.open_stream(), 10)
    assert not again.events, "told: not told again"
    assert [r.value for r in again.records] == [b"c", b"d"]


def test_an_extend_of_what_followed_the_event_proves_nothing() -> None:
    """The SDKs' ``claim`` extends the leases it took (to the caller's visibility) before its caller
    sees the event or the records, so an extend is no sign that the event was read."""
    env = make_env()
    rt, _, held = _a_leased_then_a_and_b_pruned(env)
    lost = rt.open_stream()
    d = env.pick(rt, lost, 1)
    assert env.service.extend("t", "g", [r.position for r in d.records], 60_000)[0] > 0
    rt.close_stream(lost)
    assert env.service.ack("t", "g", [r.position for r in held.records]) == 1
    assert env.ops.lag("t", "g").partitions[0].committed == 1
