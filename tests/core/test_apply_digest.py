"""The apply digest (broker/core/apply_digest.py): from the set_format that reaches format 2, every
node folds (index, outcome) of each apply into a CRC32C kept in its store. Equal code gives equal
digests; a node that decides one command differently differs from then on."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.core import apply_digest, formats
from broker.core.errors import FailedPrecondition, NotFound
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.storage.memory import MemoryStore
from broker.storage.rocks import RocksStore
from broker.v1 import internal_pb2

pytestmark = pytest.mark.unit
K = internal_pb2
START = 3  # the index of set_format(2) in LOG


def create(name: str) -> bytes:
    config = K.TopicConfig(name=name, partitions=1, durability=K.DURABILITY_DISK)
    return K.Command(create_topic=K.CreateTopicCommand(config=config, now_ms=1)).SerializeToString()


def reset(topic: str, topic_id: int) -> bytes:
    return K.Command(reset_watermark=K.ResetWatermarkCommand(topic=topic, topic_id=topic_id,
                                                             dedup_id="p")).SerializeToString()


LOG = [create("a"), formats.set_format_command(1).SerializeToString(),
       formats.set_format_command(2).SerializeToString(), create("b"), create("b"), reset("a", 1), reset("gone", 9)]


def apply_all(sm: BrokerStateMachine, log: list[bytes] = LOG, first: int = 1) -> None:
    for i, command in enumerate(log, start=first):
        sm.apply(i, command)


def test_no_digest_before_format_2_and_one_from_the_set_format_that_reaches_it() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    apply_all(sm, LOG[:2])
    assert not sm.digests.active
    with pytest.raises(FailedPrecondition, match="begin when the cluster's command format reaches 2"):
        sm.digests.at(2, 2)
    apply_all(sm, LOG[2:], first=3)
    assert sm.digests.active
    assert sm.digests.at(START, 7) == (0, START), "the digests begin at 0 at the set_format"
    values = [sm.digests.at(i, 7)[0] for i in range(START, 8)]
    assert len(set(values)) == len(values), "every apply moves the digest"
    with pytest.raises(FailedPrecondition, match="began at index 3, after 2"):
        sm.digests.at(2, 7)
    with pytest.raises(FailedPrecondition, match="index 8 is not applied"):
        sm.digests.at(8, 7)


def test_equal_logs_give_equal_digests_and_a_different_outcome_differs_from_then_on() -> None:
    a, b, c = (BrokerStateMachine(MemoryStore(), Changes()) for _ in range(3))
    apply_all(a)
    apply_all(b)
    assert [a.digests.at(i, 7) for i in range(START, 8)] == [b.digests.at(i, 7) for i in range(START, 8)]
    # c decides index 6 differently: the topic id it names is not its topic's (as code that read
    # the command differently would), so it rejects what the others applied
    apply_all(c, [*LOG[:5], reset("a", 2), LOG[6]])
    assert [c.digests.at(i, 7)[0] for i in range(START, 6)] == [a.digests.at(i, 7)[0] for i in range(START, 6)]
    assert c.digests.at(6, 7)[0] != a.digests.at(6, 7)[0]
    assert c.digests.at(7, 7)[0] != a.digests.at(7, 7)[0], "a difference is never folded away"
    assert apply_digest.outcome(None) == b"ok"


def test_a_replayed_index_changes_nothing_and_a_restart_goes_on_from_the_store(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "s")
    try:
        sm = BrokerStateMachine(store, Changes())
        apply_all(sm, LOG[:6])
        before = sm.digests.at(6, 6)
        sm.apply(6, LOG[5])
        sm.apply(4, LOG[3])
        assert sm.digests.at(6, 6) == before
        again = BrokerStateMachine(store, Changes())
        assert again.digests.at(6, 6) == before
        with pytest.raises(NotFound, match="no longer kept on this node"):
            again.digests.at(5, 6)
        again.apply(7, LOG[6])
        fresh = BrokerStateMachine(MemoryStore(), Changes())
        apply_all(fresh)
        assert again.digests.at(7, 7) == fresh.digests.at(7, 7)
    finally:
        store.close()


def test_the_digest_travels_in_snapshots(tmp_path: Path) -> None:
    stores = [RocksStore(tmp_path / name) for name in "ab"]
    try:
        source = BrokerStateMachine(stores[0], Changes())
        apply_all(source, LOG[:6])
        source.write_snapshot(str(tmp_path / "snap"))
        target = BrokerStateMachine(stores[1], Changes())
        target.restore_snapshot(str(tmp_path / "snap"), 6)
        assert target.digests.at(6, 6) == source.digests.at(6, 6)
        source.apply(7, LOG[6])
        target.apply(7, LOG[6])
        assert target.digests.at(7, 7) == source.digests.at(7, 7)
    finally:
        for store in stores:
            store.close()


def test_only_the_recent_digests_are_kept_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply_digest, "RECENT_MAX", 4)
    sm = BrokerStateMachine(MemoryStore(), Changes())
    apply_all(sm, LOG[:3])
    apply_all(sm, [create(f"t{i}") for i in range(10)], first=4)
    sm.digests.at(13, 13)
    sm.digests.at(10, 13)
    with pytest.raises(NotFound, match="index 9 is no longer kept on this node .it keeps 10 to 13"):
        sm.digests.at(9, 13)


@pytest.mark.parametrize(("digests", "differing"), [
    ({}, []),
    ({"n1": 5, "n2": 5, "n3": 5}, []),
    ({"n1": 5, "n2": 5, "n3": 6}, ["n3"]),
    ({"n1": 5, "n2": 6}, ["n1", "n2"]),
    ({"n1": 5, "n2": 6, "n3": 7}, ["n1", "n2", "n3"]),
    ({"n1": 5, "n2": 5, "n3": 6, "n4": 6}, ["n1", "n2", "n3", "n4"]),
    ({"n1": 1, "n2": 1, "n3": 1, "n4": 2, "n5": 3}, ["n4", "n5"]),
])
def test_differing_names_the_nodes_outside_a_majority(digests: dict[str, int], differing: list[str]) -> None:
    assert apply_digest.differing(digests) == differing
