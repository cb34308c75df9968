"""The lease table finds expired leases through a lazy heap of deadlines and a partition's or a
member's leases through indexes, not by walking every lease; what it answers must be exactly what a
walk of the leases finds (unit: random operations against a plain model)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from broker.leader.groups import leases as leases_module
from broker.leader.groups.leases import STALE_SLACK, Lease, LeaseTable, Position

pytestmark = pytest.mark.unit


@dataclass
class _Model:
    """What a walk of the leases answers."""

    leases: dict[Position, Lease]

    def expired(self, now_ms: int) -> set[Position]:
        return {pos for pos, lease in self.leases.items() if lease.deadline_ms <= now_ms and not lease.expiring}


def _check_indexes(table: LeaseTable, model: _Model) -> None:
    assert len(table) == len(model.leases)
    for p in range(4):
        walked = sorted(pos for pos in model.leases if pos[0] == p)
        assert sorted(lease.position for lease in table.of_partition(p)) == walked
        assert table.in_partition(p) == len(walked)
    for member in ("a", "b", "c"):
        assert sorted(x.position for x in table.of_member(member)) == sorted(
            pos for pos, lease in model.leases.items() if lease.member_id == member)
    for stream in range(3):
        assert table.held_by(stream) == sum(lease.stream_id == stream for lease in model.leases.values())
    for key in (b"k0", b"k1"):
        assert table.key_leased(key) == any(lease.key == key for lease in model.leases.values())


@pytest.mark.parametrize("slack", [4, STALE_SLACK])  # 4: the heap is rebuilt many times over
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_expired_leases_and_indexes_are_what_a_walk_finds(seed: int, slack: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leases_module, "STALE_SLACK", slack)
    rng = random.Random(seed)
    table = LeaseTable()
    model = _Model({})
    now = 0
    taken: list[Lease] = []  # expiring leases whose EXPIRE has not been "replicated" yet
    expired_total = peak = 0
    for step in range(6000):
        op = rng.choice(["add", "add", "add", "remove", "extend", "tick", "tick", "fail", "settle", "time"])
        if op == "add":
            pos = (rng.randrange(4), rng.randrange(300))
            if pos in model.leases:
                continue
            key = rng.choice([None, None, b"k0", b"k1"])
            lease = Lease(pos[0], pos[1], rng.randrange(3), rng.choice("abc"), now + rng.randint(0, 400), 1, key)
            table.add(lease)
            model.leases[pos] = lease
            assert table.heap_items() <= 2 * len(table) + slack + 1, "stale heap items pile up"
        elif op == "remove" and model.leases:
            pos = rng.choice(list(model.leases))
            assert table.remove(pos) is model.leases.pop(pos)
        elif op == "extend":
            free = [lease for lease in model.leases.values() if not lease.expiring]
            if free:
                table.set_deadline(rng.choice(free), now + rng.randint(-50, 400))
        elif op == "tick":
            want = model.expired(now)
            got = table.take_expired(now)
            assert sorted(lease.position for lease in got) == sorted(want), f"step {step}"
            assert all(lease.expiring for lease in got)
            taken += got
            expired_total += len(got)
        elif op == "fail" and taken:  # the EXPIRE failed: due again (some were settled meanwhile)
            table.unexpire(taken)
            taken = []
        elif op == "settle" and taken:  # the EXPIRE applied: the expiring leases go
            for lease in taken:
                if model.leases.get(lease.position) is lease:
                    table.remove(lease.position)
                    del model.leases[lease.position]
            taken = []
        elif op == "time":
            now += rng.randint(0, 120)
        peak = max(peak, len(table))
        assert table.heap_items() <= 2 * peak + slack + 1
        if step % 97 == 0:
            _check_indexes(table, model)
    _check_indexes(table, model)
    assert expired_total > 500, "the run expired too few leases to say anything"


def test_a_lease_given_back_and_leased_again_expires_once_at_its_new_deadline() -> None:
    table = LeaseTable()
    table.add(Lease(0, 7, 1, "a", 100, 1, None))
    table.remove((0, 7))
    table.add(Lease(0, 7, 2, "b", 100, 2, None))  # the same deadline: two heap items, one lease
    got = table.take_expired(100)
    assert [(x.position, x.stream_id) for x in got] == [((0, 7), 2)]
    assert table.take_expired(10_000) == []
    table.unexpire(got)
    assert [x.position for x in table.take_expired(100)] == [(0, 7)]


def test_an_extended_lease_expires_at_its_new_deadline_only() -> None:
    table = LeaseTable()
    lease = Lease(1, 3, 1, "a", 100, 1, None)
    table.add(lease)
    table.set_deadline(lease, 500)
    assert table.take_expired(499) == []
    assert table.take_expired(500) == [lease]
    assert table.take_expired(10_000) == []


def test_the_heap_stays_bounded_while_leases_come_and_go() -> None:
    table = LeaseTable()
    for i in range(100_000):  # a work queue at its pace: each lease settled long before its deadline
        table.add(Lease(0, i, 1, "a", 30_000 + i, 1, None))
        if i >= 64:
            table.remove((0, i - 64))
    assert len(table) == 64
    assert table.heap_items() <= 2 * 64 + STALE_SLACK + 1
    assert sorted(x.offset for x in table.take_expired(10**9)) == list(range(100_000 - 64, 100_000))
