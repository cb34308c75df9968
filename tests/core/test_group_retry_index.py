"""A pick finds due retries through ``RetryIndex`` (heaps by due time) instead of walking every
entry; what it hands out and when a stream wakes must follow the rule exactly as a full walk would
(unit: real core over MemoryStore and InMemoryReplicator, clocks the test moves)."""

from __future__ import annotations

import collections
import random

import pytest

from broker.core.groups import layout
from broker.core.groups.cursor import retry_due_ms
from broker.leader.groups.retries import STALE_SLACK, RetryIndex
from broker.leader.groups.runtime import GroupRuntime
from broker.v1 import internal_pb2
from tests.core.groups_env import Env, make_env, positions

pytestmark = pytest.mark.unit
JUMP_MS = 10 * 60 * 1000


def _walk(env: Env, rt: GroupRuntime, now_ms: int) -> tuple[list[tuple[int, int]], int | None]:
    """The rule by a full walk of the store: the due retries whose records are not leased, in
    position order, and the earliest due time of the others not leased (None: none)."""
    due, later = [], []
    for p, o, retry in layout.retries(env.state.store, rt.gid):
        if rt.leases.get((p, o)) is not None:
            continue
        if retry_due_ms(retry, now_ms) <= now_ms:
            due.append((p, o))
        else:
            later.append(retry.due_ms)
    return sorted(due), min(later, default=None)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_pick_hands_out_the_due_retries_a_full_walk_finds_in_its_order(seed: int) -> None:
    rng = random.Random(seed)
    env = make_env()
    env.topic("t", 3)
    for i in range(90):
        env.publish("t", [b"v%d" % i], partition=i % 3)
    rt = env.group("t", "g", visibility_timeout_ms=400, base_delay_ms=50, max_delay_ms=3000, max_attempts=50,
                   max_pending=1000)
    stream = rt.open_stream()
    held: list[bytes] = []
    kinds: collections.Counter[str] = collections.Counter()
    checked = most_due = 0
    for _ in range(600):
        op = rng.choice(["pick", "pick", "pick", "ack", "nack", "nack", "release", "time", "time", "jump"])
        if op == "pick":
            rt.refresh()
            now = env.clock.now_ms()
            due, later = _walk(env, rt, now)
            assert rt.next_due_ms("m", now) == later, "the stream would wake at another time"
            limit = rng.randint(1, 15)
            delivery = env.pick(rt, stream, limit)
            retried = [(r.partition, r.offset) for r in delivery.records if r.delivery_attempt > 1]
            assert retried == due[:limit], "the pick handed out other retries, or in another order"
            held += positions(delivery)
            checked += 1
            most_due = max(most_due, len(due))
        elif op in ("ack", "nack", "release") and held:
            chosen = rng.sample(held, rng.randint(1, min(8, len(held))))
            held = [h for h in held if h not in chosen]
            if op == "ack":
                env.service.ack("t", "g", chosen)
            else:
                env.service.nack("t", "g", chosen, rng.choice([0, 20, 700, 5000]), release=op == "release")
        elif op == "time":
            env.clock.advance(rng.choice([0, 30, 200, 1000]))
            env.service.tick()  # leases past their deadline expire into retries
        elif op == "jump":
            env.clock.step_wall(rng.choice([-JUMP_MS, -300, 300, JUMP_MS]))
        else:
            continue
        kinds[op] += 1
    assert kinds["nack"] > 30 and kinds["release"] > 10 and kinds["jump"] > 20 and checked > 100
    assert most_due >= 5, "the sequence kept several retries due at once"


def _retry(due_ms: int, delay_ms: int | None = 1000) -> internal_pb2.RetryState:
    retry = internal_pb2.RetryState(attempts=1, due_ms=due_ms)
    if delay_ms is not None:
        retry.delay_ms = delay_ms
    return retry


def test_the_index_takes_due_entries_in_offset_order_and_keeps_the_rest_waiting() -> None:
    index = RetryIndex()
    leased: set[tuple[int, int]] = {(0, 4)}
    index.replace_all({(0, 7): _retry(100), (0, 3): _retry(300), (0, 4): _retry(50), (1, 1): _retry(100),
                       (0, 5): _retry(50, None)}, leased.__contains__)
    assert [o for o, _ in index.take(0, 100, 10, leased.__contains__)] == [5, 7], "due at 100, not leased"
    assert index.next_due_ms([0, 1], 100, leased.__contains__) == 300, "partition 1's entry is due already"
    index.put_back(0, [7])
    leased.discard((0, 4))
    index.unleased((0, 4))
    assert [o for o, _ in index.take(0, 100, 1, leased.__contains__)] == [4], "the lowest offset first"
    assert [o for o, _ in index.take(0, 100, 5, leased.__contains__)] == [7]
    assert index.take(0, 100, 5, leased.__contains__) == []
    index.update((0, 3), _retry(900))  # rewritten: due later
    assert index.next_due_ms([0], 100, leased.__contains__) == 900
    index.update((0, 3), None)
    assert index.next_due_ms([0], 100, leased.__contains__) is None and (0, 3) not in index.entries


def test_the_index_follows_the_clock_back_both_ways() -> None:
    index = RetryIndex()
    never: set[tuple[int, int]] = set()
    index.replace_all({(0, 1): _retry(10_000, 1000), (0, 2): _retry(10_000, None)}, never.__contains__)
    assert index.take(0, 9_500, 5, never.__contains__) == [], "within its delay: waits for due_ms"
    taken = index.take(0, 8_000, 5, never.__contains__)
    assert [o for o, _ in taken] == [1], "further away than its delay: due now; without a delay: due at due_ms"
    index.put_back(0, [1])
    assert index.take(0, 9_500, 5, never.__contains__) == [], "seen due, then the clock went forward again"
    assert [o for o, _ in index.take(0, 10_000, 5, never.__contains__)] == [1, 2]


def test_the_heaps_stay_bounded_through_many_redeliveries() -> None:
    index = RetryIndex()
    leased: set[tuple[int, int]] = set()
    index.replace_all({(0, o): _retry(0) for o in range(50)}, leased.__contains__)
    for cycle in range(2_000):
        for o, _ in index.take(0, cycle, 50, leased.__contains__):
            leased.add((0, o))
        for o in range(50):  # each lease ends in a nack: the entry is rewritten, due a little later
            leased.discard((0, o))
            index.update((0, o), _retry(cycle + 1, 1))
            index.unleased((0, o))
        assert index.scheduled_items <= 2 * len(index.entries) + STALE_SLACK + 4 * 50
    assert len(index.entries) == 50
