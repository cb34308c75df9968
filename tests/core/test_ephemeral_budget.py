"""The leader's rings of `ephemeral` records are bounded in bytes, all of them together
(``broker.leader.ephemeral``): before, 10,000 records of 1 MiB per partition were 10 GiB."""

from __future__ import annotations

import random

import pytest

from broker.leader.ephemeral import EphemeralHub

pytestmark = pytest.mark.unit


def held(hub: EphemeralHub, topic_id: int, partition: int) -> tuple[int, int, int, int]:
    return hub.bounds(topic_id, partition)


def test_the_rings_together_keep_to_the_budget_and_the_oldest_go_first() -> None:
    hub = EphemeralHub(lambda: None, capacity=1000, bytes_max=10_000)
    for i in range(50):
        hub.publish(1, 1, [0], [bytes([i]) * 1000], 1)
    start, end, records, size = held(hub, 1, 0)
    assert (start, end, records, size) == ((1 << 32) + 40, (1 << 32) + 50, 10, 10_000)
    assert [r.body[0] for r in hub.read(1, 0, start, 100)] == list(range(40, 50))  # the newest stay
    assert hub.bytes_held == 10_000


def test_a_busy_partition_does_not_empty_the_quiet_ones() -> None:
    hub = EphemeralHub(lambda: None, capacity=1000, bytes_max=10_000)
    hub.publish(1, 1, [1, 1], [b"q" * 1000, b"q" * 1000], 1)  # a quiet partition, well under its share
    hub.publish(2, 1, [0], [b"o" * 1000], 1)  # another topic's
    for _ in range(100):
        hub.publish(1, 1, [0], [b"b" * 1000], 1)
    assert held(hub, 1, 1)[2:] == (2, 2000) and held(hub, 2, 0)[2:] == (1, 1000)
    assert held(hub, 1, 0)[2:] == (7, 7000) and hub.bytes_held == 10_000
    # a ring appended to below its share (the average) takes from the largest; at its share, from itself
    hub.publish(1, 1, [1] * 6, [b"q" * 1000] * 6, 1)
    assert [held(hub, *key)[2] for key in ((1, 1), (1, 0), (2, 0))] == [3, 6, 1] and hub.bytes_held == 10_000


def test_a_record_larger_than_the_budget_is_kept_alone() -> None:
    hub = EphemeralHub(lambda: None, capacity=10, bytes_max=1000)
    hub.publish(1, 1, [0, 0], [b"a" * 600, b"b" * 5000], 1)
    assert held(hub, 1, 0)[2:] == (1, 5000)


def test_random_appends_keep_every_count_exact() -> None:
    rng = random.Random(7)
    hub = EphemeralHub(lambda: None, capacity=20, bytes_max=50_000)
    for step in range(3000):
        topic = rng.randrange(1, 4)
        if rng.random() < 0.01:
            hub.forget_topic(topic)
            continue
        parts = [rng.randrange(3) for _ in range(rng.randint(1, 5))]
        term = 1 if step < 2500 else 2
        hub.publish(topic, term, parts, [b"x" * rng.randrange(1, 4000) for _ in parts], step)
        rings = [hub.bounds(t, p) for t in range(1, 4) for p in range(3)]
        assert hub.bytes_held == sum(r[3] for r in rings) <= 50_000
        assert all(r[2] <= 20 and r[1] - r[0] == r[2] for r in rings)
        assert all(r[3] == sum(len(x.body) for x in hub.read(t, p, 0, 100))
                   for t in range(1, 4) for p in range(3) for r in [hub.bounds(t, p)])
