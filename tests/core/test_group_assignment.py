"""The stream-mode assignment (``Membership._target``) counts what it assigns instead of summing the
assignment once per member and free partition (which made a join O(members x partitions): 9,000
members took 0.5 s per join). The result must be exactly the old one: compared here with the old
algorithm, kept as the reference, over random joins, leaves and expiries."""

from __future__ import annotations

import random

import pytest

from broker.leader.groups.membership import Membership

pytestmark = pytest.mark.unit


def reference_target(m: Membership) -> dict[int, str]:
    members = sorted(m._last_seen)
    if not members:
        return {}
    base, extra = divmod(m._partitions, len(members))
    owned: dict[str, list[int]] = {x: [] for x in members}
    for p in range(m._partitions):
        holder = m._revoking[p].to_member if p in m._revoking else m._owner.get(p)
        if holder in owned:
            owned[holder].append(p)
    by_load = sorted(members, key=lambda x: (-len(owned[x]), x))
    capacity = {x: base + (1 if i < extra else 0) for i, x in enumerate(by_load)}
    target: dict[int, str] = {}
    for x in members:
        for p in owned[x][:capacity[x]]:
            target[p] = x
    free = [p for p in range(m._partitions) if p not in target]
    for x in by_load:
        while free and sum(1 for owner in target.values() if owner == x) < capacity[x]:
            target[free.pop(0)] = x
    return target


@pytest.mark.parametrize("seed", range(6))
def test_the_assignment_is_the_old_one(seed: int) -> None:
    rng = random.Random(seed)
    partitions = rng.choice([1, 3, 8, 64])
    m = Membership(partitions, session_timeout_ms=1000, revoke_timeout_ms=500)
    now = 0
    for _ in range(400):
        now += rng.randint(0, 300)
        op = rng.random()
        if op < 0.5:
            m.heartbeat(f"m{rng.randrange(90)}", now)
        elif op < 0.7 and m.members():
            m.leave(rng.choice(m.members()), now)
        elif op < 0.85:
            m.expire(now)
        else:
            m.hand_over(now, lambda p: rng.random() < 0.5)
        assert m._target() == reference_target(m)
