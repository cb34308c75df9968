"""A group runtime re-reads only the retry entries that changed (``GroupVersions``), and what it
holds always equals a full read of the store (unit: real core over MemoryStore and InMemoryReplicator)."""

from __future__ import annotations

import collections
import random

import pytest

from broker.core.groups import layout
from broker.leader.groups.versions import GroupVersions
from broker.v1 import internal_pb2
from tests.core.groups_env import Env, make_env, positions

pytestmark = pytest.mark.unit


def test_versions_list_the_retry_positions_of_each_apply_and_say_when_they_cannot() -> None:
    versions = GroupVersions(positions_max=6)
    versions.bump(1, frozenset({(0, 1), (0, 2)}))
    versions.bump(1, frozenset())
    versions.bump(2, frozenset({(1, 9)}))
    versions.bump(1, frozenset({(0, 3)}))
    assert versions.version(1) == 3 and versions.version(2) == 1 and versions.version(7) == 0
    assert versions.retries_changed(1, 0) == {(0, 1), (0, 2), (0, 3)}
    assert versions.retries_changed(1, 1) == {(0, 3)}
    assert versions.retries_changed(1, 3) == set()
    assert versions.retries_changed(1, -1) is None, "a runtime that never read reads everything"
    versions.bump(1, None)  # a range delete: not known position by position
    assert versions.retries_changed(1, 3) is None and versions.retries_changed(1, 4) == set()
    versions.bump(2, frozenset({(1, p) for p in range(4)}))  # 10 positions logged: the oldest go
    assert versions.retries_changed(1, 0) is None, "group 1's first versions are forgotten"
    assert versions.retries_changed(2, 1) == {(1, 0), (1, 1), (1, 2), (1, 3)}
    assert versions.retries_changed(1, 4) == set()


def _full_read(env: Env, gid: int) -> tuple[dict[tuple[int, int], internal_pb2.RetryState], dict[bytes, int]]:
    retries = {(p, o): r for p, o, r in layout.retries(env.state.store, gid)}
    keys = collections.Counter(r.key for r in retries.values() if r.has_key)
    return retries, dict(keys)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_runtime_kept_current_by_changed_positions_equals_a_full_read(seed: int) -> None:
    rng = random.Random(seed)
    env = make_env()
    env.topic("t", 2)
    for i in range(60):
        env.publish("t", [b"v%d" % i], key=b"k%d" % rng.randrange(5), partition=i % 2)
    rt = env.group("t", "g", visibility_timeout_ms=500, base_delay_ms=50, max_delay_ms=400, max_attempts=3,
                   ordered=seed == 2)
    stream = rt.open_stream()
    held: list[bytes] = []
    kinds: collections.Counter[str] = collections.Counter()
    most = 0
    for _ in range(400):
        op = rng.choice(["pick", "pick", "ack", "nack", "nack", "discard", "time", "seek", "retry", "purge"])
        if op == "pick":
            held += positions(env.pick(rt, stream, rng.randint(1, 12)))
        elif op in ("ack", "nack", "discard") and held:
            chosen = rng.sample(held, rng.randint(1, min(6, len(held))))
            held = [h for h in held if h not in chosen]
            if op == "ack":
                env.service.ack("t", "g", chosen)
            elif op == "nack":
                env.service.nack("t", "g", chosen, rng.choice([0, 30]), release=False)
            else:
                env.service.discard("t", "g", chosen, "test")
        elif op == "time":
            env.clock.advance(rng.randint(0, 600))
            env.service.tick()  # leases past their deadline expire into retries
        elif op == "seek" and rng.random() < 0.15:
            env.ops.seek("t", "g", internal_pb2.Position(offset=rng.randrange(20)), rng.choice([None, 0, 1]))
            held = []
        elif op == "retry" and rng.random() < 0.3:
            env.ops.retry_dead_letters("t", "g", [], True)
        elif op == "purge" and rng.random() < 0.1:
            env.ops.purge_dead_letters("t", "g")
        else:
            continue
        kinds[op] += 1
        assert env.service.runtime("t", "g") is rt
        rt.refresh()
        assert rt.retries_as_read() == _full_read(env, rt.gid), f"after {op}"
        most = max(most, len(rt.retries_as_read()[0]))
    assert kinds["nack"] > 20 and kinds["time"] > 20 and kinds["seek"] > 0 and kinds["retry"] > 0
    assert most >= 5, "the sequence kept several records waiting for a retry at once"
