"""A leader wall clock that goes back (or a healed forward jump): leases and sessions run on the
leader-local lease clock, retries are due when ``due_ms - now > delay_ms``, dedup windows run on
the window clock (unit: real core over MemoryStore and InMemoryReplicator, clocks the test moves)."""

from __future__ import annotations

import pytest

from broker.core.groups import layout
from broker.core.groups.cursor import retry_due_ms
from broker.leader.topic_log import Placement
from broker.v1 import broker_pb2, internal_pb2
from tests.core.groups_env import Env, make_env, positions, values
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit
JUMP_MS = 10 * 60 * 1000  # ten minutes


def test_a_lease_expires_on_the_lease_clock_when_the_wall_clock_goes_back() -> None:
    env = make_env()
    env.clock.mono_ms = 5_000  # the lease clock reads apart from the wall clock
    env.topic("t")
    env.publish("t", [b"x"])
    rt = env.group("t", "g", visibility_timeout_ms=1000, base_delay_ms=100)
    first = env.pick(rt, rt.open_stream())
    assert values(first) == [b"x"]
    env.clock.step_wall(-JUMP_MS)
    env.clock.mono_ms += 1000
    env.service.tick()
    rt.refresh()
    assert [(p, o) for p, o, _ in layout.retries(env.state.store, rt.gid)] == [(0, 0)], "the lease did not expire"


def test_extend_reports_a_wall_deadline_and_measures_the_lease_on_the_lease_clock() -> None:
    env = make_env()
    env.clock.mono_ms = 5_000  # the lease clock reads apart from the wall clock
    env.topic("t")
    env.publish("t", [b"x"])
    rt = env.group("t", "g", visibility_timeout_ms=1000)
    d = env.pick(rt, rt.open_stream())
    assert env.service.extend("t", "g", positions(d), 3000) == [env.clock.now_ms() + 3000]
    lease = rt.leases.get((0, 0))
    assert lease is not None and lease.deadline_ms == env.clock.monotonic_ms() + 3000


def test_a_nacked_retry_is_redelivered_on_time_when_the_wall_clock_goes_back() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"x"])
    rt = env.group("t", "g", base_delay_ms=1000, max_delay_ms=1000)
    s = rt.open_stream()
    env.service.nack("t", "g", positions(env.pick(rt, s)), 0, release=False)
    rt.refresh()
    assert not env.pick(rt, s).records, "not due before its delay"
    env.clock.step_wall(-JUMP_MS)  # the leader's clock goes back: due_ms - now > delay
    again = env.pick(rt, s)
    assert values(again) == [b"x"] and again.records[0].delivery_attempt == 2, "the retry waits for the jump"


def test_a_retry_stored_without_its_delay_is_due_at_due_ms_only() -> None:
    old = internal_pb2.RetryState(attempts=1, due_ms=10_000)  # stored before delay_ms existed
    decoded = internal_pb2.RetryState.FromString(old.SerializeToString())
    assert not decoded.HasField("delay_ms")
    assert retry_due_ms(decoded, 0) == 10_000 and retry_due_ms(decoded, 10_000) == 10_000
    new = internal_pb2.RetryState(attempts=1, due_ms=10_000, delay_ms=1000)
    assert retry_due_ms(new, 9_500) == 10_000, "within its delay: due at due_ms"
    assert retry_due_ms(new, 8_000) == 8_000, "further away than its delay: the clock went back, due now"


def test_the_next_due_time_follows_the_rule() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"x"])
    rt = env.group("t", "g", base_delay_ms=1000, max_delay_ms=1000)
    env.service.nack("t", "g", positions(env.pick(rt, rt.open_stream())), 0, release=False)
    rt.refresh()
    assert rt.next_due_ms("m", env.clock.now_ms()) == env.clock.now_ms() + 1000
    assert rt.next_due_ms("m", env.clock.now_ms() - JUMP_MS) is None, "the clock went back: due now, none waits"
    state = rt.retry_state((0, 0))
    assert state is not None and retry_due_ms(state, env.clock.now_ms() - JUMP_MS) == env.clock.now_ms() - JUMP_MS


def publish_keyed(env: Env, key: str) -> Placement:
    request = publish_request(topic="t", records=[broker_pb2.PublishRecord(value=b"v", idempotency_key=key)])
    result = env.log.publish(request)[0]
    return result


def keyed_topic() -> Env:
    env = make_env()
    env.log.create_topic(internal_pb2.TopicConfig(name="t", partitions=1, dedup_window_ms=60_000))
    return env


def test_a_dedup_key_inside_its_window_is_refused_after_the_clock_goes_back() -> None:
    """The lookup would read buckets older than the one the key is in."""
    env = keyed_topic()
    first = publish_keyed(env, "k1")
    env.clock.step_wall(-JUMP_MS)
    again = publish_keyed(env, "k1")
    assert again.duplicate, "a key inside its window was accepted again"
    assert again.offset == first.offset


def test_a_dedup_key_inside_its_window_is_refused_after_a_forward_jump_is_healed() -> None:
    """The key went into the jumped bucket; the healed lookup would read the old ones."""
    env = keyed_topic()
    env.clock.step_wall(JUMP_MS)
    first = publish_keyed(env, "k1")
    env.log.expire_dedup()
    env.clock.step_wall(-JUMP_MS)
    env.log.expire_dedup()
    again = publish_keyed(env, "k1")
    assert again.duplicate, "a key inside its window was accepted again"
    assert again.offset == first.offset


def test_keys_still_expire_once_their_window_has_passed() -> None:
    env = keyed_topic()
    publish_keyed(env, "k1")
    env.clock.step_wall(-JUMP_MS)
    env.clock.step_wall(JUMP_MS + 60_001)
    env.log.expire_dedup()
    assert not publish_keyed(env, "k1").duplicate


def test_a_silent_member_session_expires_on_the_lease_clock_when_the_wall_clock_goes_back() -> None:
    env = make_env()
    env.clock.mono_ms = 5_000  # the lease clock reads apart from the wall clock
    env.topic("t", 2)
    rt = env.group("t", "g", mode=internal_pb2.DELIVERY_MODE_STREAM, session_timeout_ms=1000)
    env.service.join("t", "g", "a", internal_pb2.GroupConfig())
    env.service.join("t", "g", "b", internal_pb2.GroupConfig())
    env.clock.step_wall(-JUMP_MS)
    env.clock.mono_ms += 1001
    env.service.heartbeat("t", "g", "b")  # b stays; a is silent past its session
    env.service.tick()
    with rt.lock:
        assert rt.members is not None
        assert rt.members.members() == ["b"], "a silent member outlived its session"
        assert rt.members.assigned("b") == [0, 1]
