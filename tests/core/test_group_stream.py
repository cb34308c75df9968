"""Stream-mode groups: one live owner per partition, sessions, incremental rebalancing, per-key
order across a handover (unit)."""

from __future__ import annotations

import pytest

from broker.leader.groups.membership import Membership
from broker.v1 import internal_pb2
from tests.core.groups_env import make_env

pytestmark = pytest.mark.unit
STREAM = internal_pb2.DELIVERY_MODE_STREAM


def owners(m: Membership, partitions: int) -> dict[int, str | None]:
    return {p: m.owner(p) for p in range(partitions)}


def test_assignment_is_balanced_and_sticky() -> None:
    m = Membership(6, session_timeout_ms=1000, revoke_timeout_ms=500)
    m.heartbeat("a", 0)
    assert m.assigned("a") == [0, 1, 2, 3, 4, 5]
    m.heartbeat("b", 10)
    # a keeps three partitions; the three moving to b are revoked first (a stops getting them)
    assert len(m.assigned("a")) == 3 and m.assigned("b") == []
    moved = m.hand_over(20, busy=lambda p: False)
    assert len(moved) == 3 and len(m.assigned("b")) == 3
    kept = set(m.assigned("a"))
    m.heartbeat("c", 30)
    m.hand_over(40, busy=lambda p: False)
    assert sorted(len(m.assigned(x)) for x in "abc") == [2, 2, 2]
    assert set(m.assigned("a")) <= kept, "a only lost partitions, it gained none"


def test_a_busy_partition_moves_after_the_revoke_timeout_and_a_dead_member_after_its_session() -> None:
    m = Membership(2, session_timeout_ms=1000, revoke_timeout_ms=500)
    m.heartbeat("a", 0)
    m.heartbeat("b", 0)
    assert m.hand_over(100, busy=lambda p: True) == []
    assert len(m.hand_over(500, busy=lambda p: True)) == 1
    m.heartbeat("a", 900)
    dead, freed = m.expire(1001)
    assert dead == ["b"] and len(freed) == 1
    assert m.assigned("a") == [0, 1]


def test_each_partition_has_one_owner_and_order_per_partition_survives_a_handover() -> None:
    env = make_env()
    env.topic("t", 4)
    for i in range(20):
        env.publish("t", [b"%d" % i], partition=i % 4)
    rt = env.group("t", "g", mode=STREAM, session_timeout_ms=1000, visibility_timeout_ms=5000)
    env.service.join("t", "g", "a", internal_pb2.GroupConfig())
    sa = rt.open_stream()
    first = env.pick(rt, sa, 100, member="a")
    assert len(first.records) == 20
    _, assigned_b, _ = env.service.join("t", "g", "b", internal_pb2.GroupConfig())
    assert assigned_b == [], "b waits until a has given the partitions back"
    with rt.lock:
        assert rt.members is not None
        kept = rt.members.assigned("a")
    moving = sorted(set(range(4)) - set(kept))
    assert len(kept) == 2 and len(moving) == 2
    env.clock.advance(10)
    env.service.tick()
    assert env.service.heartbeat("t", "g", "b") == [], "a still holds leases on the moving partitions"
    # a finishes one moving partition: only that one moves now (incremental)
    env.service.ack("t", "g", [r.position for r in first.records if r.partition == moving[0]])
    env.service.tick()
    assert env.service.heartbeat("t", "g", "b") == [moving[0]]
    # a's leases on the other one run out (revoke timeout): it moves, its records go back in order
    env.clock.advance(5000)
    env.service.heartbeat("t", "g", "a")
    env.service.heartbeat("t", "g", "b")
    env.service.tick()
    assert env.service.heartbeat("t", "g", "b") == moving
    assert env.service.heartbeat("t", "g", "a") == kept
    env.clock.advance(1000)  # past the backoff of the expired records
    got = env.pick(rt, rt.open_stream(), 100, member="b")
    assert [r.offset for r in got.records] == [0, 1, 2, 3, 4]
    assert {r.partition for r in got.records} == {moving[1]}
    again_a = env.pick(rt, sa, 100, member="a").records
    assert again_a and {r.partition for r in again_a} <= set(kept), "a only gets its own partitions' retries"


def test_commit_moves_the_watermark_and_never_back() -> None:
    env = make_env()
    env.topic("t", 1)
    env.publish("t", [b"%d" % i for i in range(5)])
    rt = env.group("t", "g", mode=STREAM)
    env.service.commit("t", "g", 0, 3)
    env.service.commit("t", "g", 0, 1)
    rt.refresh()
    assert rt.cursor(0).committed == 3
    env.service.join("t", "g", "a", internal_pb2.GroupConfig())
    assert [r.offset for r in env.pick(rt, rt.open_stream(), 10, member="a").records] == [3, 4]
