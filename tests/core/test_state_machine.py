"""The state machine applied directly: determinism, idempotence by index, rejections, snapshots."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.core import record_log, records
from broker.core.applied import Appended, Rejected
from broker.core.errors import TopicExists, TopicNotFound
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.storage import Column
from broker.storage.memory import MemoryStore
from broker.storage.rocks import RocksStore
from broker.v1 import internal_pb2
from tests.record_store import flip_record_byte

pytestmark = pytest.mark.unit


def create(name: str, partitions: int = 2) -> bytes:
    return internal_pb2.Command(create_topic=internal_pb2.CreateTopicCommand(
        config=internal_pb2.TopicConfig(name=name, partitions=partitions), now_ms=1000)).SerializeToString()


def append(name: str, topic_id: int, parts: list[int], now_ms: int = 2000) -> bytes:
    bodies = [internal_pb2.RecordBody(value=b"v%d" % i).SerializeToString() for i in range(len(parts))]
    return internal_pb2.Command(append=internal_pb2.AppendCommand(
        topic=name, topic_id=topic_id, now_ms=now_ms, partitions=parts, bodies=bodies)).SerializeToString()


def drop(name: str, topic_id: int) -> bytes:
    return internal_pb2.Command(drop_topic=internal_pb2.DropTopicCommand(name=name, topic_id=topic_id)
                                ).SerializeToString()


def digest(sm: BrokerStateMachine) -> list[tuple[bytes, bytes]]:
    return list(sm.store.scan(Column.RECORDS, b"", b"\xff" * 16)) + list(sm.store.scan(Column.META, b"", b"\xff"))


def test_append_assigns_contiguous_offsets_per_partition() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    meta = sm.apply(1, create("t"))
    assert isinstance(meta, internal_pb2.TopicMeta)
    result = sm.apply(2, append("t", meta.topic_id, [0, 1, 0, 0]))
    assert isinstance(result, Appended)
    assert [(p, o) for p, o, _, _ in result.placements] == [(0, 0), (1, 0), (0, 1), (0, 2)]
    assert sm.partition(meta.topic_id, 0).end_offset == 3
    assert sm.applied_index() == 2


def test_reapplying_an_index_changes_nothing() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("t"))
    sm.apply(2, append("t", 1, [0]))
    before = digest(sm)
    assert sm.apply(2, append("t", 1, [0])) is None
    assert sm.apply(1, create("other")) is None
    assert digest(sm) == before


def test_same_commands_give_identical_stores() -> None:
    cmds = [create("a"), append("a", 1, [0, 1, 1]), create("b", 1), append("b", 2, [0]), drop("a", 1)]
    stores = []
    for _ in range(2):
        sm = BrokerStateMachine(MemoryStore(), Changes())
        for i, c in enumerate(cmds, start=1):
            sm.apply(i, c)
        stores.append(digest(sm))
    assert stores[0] == stores[1]


def test_rejections_are_deterministic_and_write_only_the_index() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("t"))
    res = sm.apply(2, create("t"))
    assert isinstance(res, Rejected) and isinstance(res.error, TopicExists)
    res = sm.apply(3, append("t", 99, [0]))  # stale incarnation
    assert isinstance(res, Rejected) and isinstance(res.error, TopicNotFound)
    assert sm.partition(1, 0).end_offset == 0
    assert sm.applied_index() == 3


def test_timestamps_never_decrease_within_a_partition() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("t", 1))
    sm.apply(2, append("t", 1, [0], now_ms=5000))
    res = sm.apply(3, append("t", 1, [0], now_ms=4000))  # a new leader with a slower clock
    assert isinstance(res, Appended) and res.placements[0][2] == 5000


def stored_timestamps(sm: BrokerStateMachine, topic_id: int, partition: int) -> list[int]:
    return [e.timestamp_ms for e in record_log.read(sm.store, topic_id, partition, 0, records.MAX_OFFSET)]


def test_a_command_with_an_older_now_ms_gets_the_previous_timestamp() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("t", 2))
    sm.apply(2, append("t", 1, [0, 1], now_ms=5000))
    res = sm.apply(3, append("t", 1, [0, 0, 1], now_ms=3000))  # the leader's clock jumped back
    assert isinstance(res, Appended)
    assert [ts for _, _, ts, _ in res.placements] == [5000, 5000, 5000]
    res = sm.apply(4, append("t", 1, [0], now_ms=6000))  # time moves on from the floor
    assert isinstance(res, Appended) and res.placements[0][2] == 6000
    assert stored_timestamps(sm, 1, 0) == [5000, 5000, 5000, 6000]
    assert sm.partition(1, 0).last_timestamp_ms == 6000 and sm.partition(1, 1).last_timestamp_ms == 5000


def test_the_timestamp_floor_is_per_partition() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("t", 2))
    sm.apply(2, append("t", 1, [0], now_ms=9000))
    res = sm.apply(3, append("t", 1, [1, 0], now_ms=2000))
    assert isinstance(res, Appended) and [ts for _, _, ts, _ in res.placements] == [2000, 9000]


def test_the_timestamp_floor_survives_a_restart_over_the_same_store(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db")
    sm = BrokerStateMachine(store, Changes())
    sm.apply(1, create("t", 1))
    sm.apply(2, append("t", 1, [0], now_ms=5000))
    store.close()
    reopened = BrokerStateMachine(RocksStore(tmp_path / "db"), Changes())
    assert reopened.partition(1, 0).last_timestamp_ms == 5000
    res = reopened.apply(3, append("t", 1, [0], now_ms=4000))
    assert isinstance(res, Appended) and res.placements[0][2] == 5000
    assert stored_timestamps(reopened, 1, 0) == [5000, 5000]
    reopened.store.close()


def test_the_timestamp_floor_travels_in_a_snapshot(tmp_path: Path) -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("t", 1))
    sm.apply(2, append("t", 1, [0], now_ms=7000))
    sm.write_snapshot(str(tmp_path / "snap"))
    other = BrokerStateMachine(MemoryStore(), Changes())
    other.restore_snapshot(str(tmp_path / "snap"), 2)
    res = other.apply(3, append("t", 1, [0], now_ms=1000))
    assert isinstance(res, Appended) and res.placements[0][2] == 7000


def test_drop_removes_every_key_of_the_topic() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("t"))
    sm.apply(2, append("t", 1, [0, 1]))
    sm.apply(3, drop("t", 1))
    begin, end = records.topic_range(1)
    assert list(sm.store.scan(Column.RECORDS, begin, end)) == []
    assert sm.topic("t") is None
    meta = sm.apply(4, create("t"))
    assert isinstance(meta, internal_pb2.TopicMeta) and meta.topic_id == 2  # a new incarnation


def test_state_survives_reopen_and_snapshot_restore(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "db")
    sm = BrokerStateMachine(store, Changes())
    sm.apply(1, create("t"))
    sm.apply(2, append("t", 1, [0, 0]))
    sm.write_snapshot(str(tmp_path / "snap"))
    sm.apply(3, append("t", 1, [0]))
    store.close()
    reopened = BrokerStateMachine(RocksStore(tmp_path / "db2"), Changes())
    reopened.restore_snapshot(str(tmp_path / "snap"), 2)
    assert reopened.applied_index() == 2
    assert reopened.partition(1, 0).end_offset == 2
    assert reopened.topic("t") is not None
    # a snapshot older than what a node has is ignored
    reopened.apply(3, append("t", 1, [0]))
    reopened.write_snapshot(str(tmp_path / "snap2"))
    reopened.restore_snapshot(str(tmp_path / "snap2"), 3)
    assert reopened.partition(1, 0).end_offset == 3


def test_stored_records_carry_a_checked_crc() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("t", 1))
    sm.apply(2, append("t", 1, [0]))
    [entry] = record_log.read(sm.store, 1, 0, 0, 10)
    assert entry.offset == 0 and entry.error is None
    flip_record_byte(sm.store, 1, 0, 0)
    [entry] = record_log.read(sm.store, 1, 0, 0, 10)
    assert entry.error == "checksum mismatch" and entry.body == b""
    key, value = next(iter(sm.store.scan(Column.RECORDS, b"", b"\xff" * 16)))
    batch = sm.store.batch()
    batch.delete(Column.RECORDS, key)
    batch.put(Column.RECORDS, records.record_key(1, 0, 7), value)  # right bytes, wrong place
    sm.store.write(batch)
    assert [e.error for e in record_log.read(sm.store, 1, 0, 0, 10)] == [
        "batch header checksum mismatch"] * 8, "offsets 0..7: the damaged value stands for all of them"


@pytest.mark.parametrize("parts", [[0, 0, 0], [1, 0, 1, 1, 0], [0, 1, 1, 0, 0, 1, 0]])
def test_batches_without_keys_are_placed_and_stored_like_batches_with_keys(parts: list[int]) -> None:
    """The per-partition path (no keys: every record stored; its answer in runs) and the
    per-record one (keys; its answer listed) agree."""
    plain, keyed = BrokerStateMachine(MemoryStore(), Changes()), BrokerStateMachine(MemoryStore(), Changes())
    config = internal_pb2.TopicConfig(name="t", partitions=2, dedup_window_ms=60_000)
    for sm in (plain, keyed):
        sm.apply(1, internal_pb2.Command(create_topic=internal_pb2.CreateTopicCommand(config=config, now_ms=1000)
                                         ).SerializeToString())
        sm.apply(2, append("t", 1, [1, 0], now_ms=9000))  # a timestamp floor above the next now_ms
    with_keys = internal_pb2.Command.FromString(append("t", 1, parts, now_ms=4000))
    with_keys.append.idempotency_keys.extend(f"k{i}" for i in range(len(parts)))
    a, b = plain.apply(3, append("t", 1, parts, now_ms=4000)), keyed.apply(3, with_keys.SerializeToString())
    assert isinstance(a, Appended) and isinstance(b, Appended) and a.placements == b.placements
    assert a.placements[0][2] == 9000
    first_seen = list(dict.fromkeys(parts))
    assert a.ranges() == [(p, next(o for q, o, _, _ in b.placements if q == p), parts.count(p), 9000)
                          for p in first_seen]
    assert b.ranges() is None, "listed placements are checked by the caller (duplicates, gaps)"
    for p in (0, 1):
        assert plain.partition(1, p) == keyed.partition(1, p)
        assert list(record_log.read(plain.store, 1, p, 0, 10)) == list(record_log.read(keyed.store, 1, p, 0, 10))


def test_an_answer_in_runs_reads_as_its_placements() -> None:
    """``Appended``: listed placements, then records in runs; one meaning either way."""
    head = [(1, 0, 0, True), (0, 4, 50, True)]
    runs = {2: (10, 70), 0: (5, 71)}
    both = Appended(head, [2, 0, 2, 2, 0], runs)
    assert len(both) == 7
    assert both.placements == head + [(2, 10, 70, False), (0, 5, 71, False), (2, 11, 70, False),
                                      (2, 12, 70, False), (0, 6, 71, False)]
    assert both.ranges() is None, "a listed placement (here duplicates) leaves the checks to the caller"
    only = Appended([], [3, 3, 3], {3: (100, 9)})
    assert only.placements == [(3, 100, 9, False), (3, 101, 9, False), (3, 102, 9, False)]
    assert only.ranges() == [(3, 100, 3, 9)]
    assert Appended([], [2, 0, 2], runs).ranges() == [(2, 10, 2, 70), (0, 5, 1, 71)]
    listed = Appended(head)
    assert listed.placements is head and len(listed) == 2 and listed.ranges() is None
    assert Appended([]).ranges() is None and Appended([]).placements == []
    with pytest.raises(ValueError, match="need their runs"):
        Appended([], [1])


@pytest.mark.parametrize("kind", ["rocks", "memory"])
def test_discarded_state_is_empty_durably_and_a_snapshot_restores_over_it(kind: str, tmp_path: Path) -> None:
    """What the replicator does when a power loss left the store ahead of its journal: discard, then
    restore the snapshot (and replay the journal) as into an empty store."""
    def open_store() -> RocksStore | MemoryStore:
        return RocksStore(tmp_path / "db") if kind == "rocks" else MemoryStore()

    store = open_store()
    sm = BrokerStateMachine(store, Changes(), journaled=kind == "rocks")
    sm.apply(1, create("t"))
    sm.apply(2, append("t", 1, [0, 0]))
    sm.write_snapshot(str(tmp_path / "snap"))
    sm.apply(3, append("t", 1, [0]))
    sm.discard_state()
    assert sm.applied_index() == 0 and sm.topic("t") is None
    assert list(sm.store.scan(Column.RECORDS, b"", b"\xff" * records.RECORD_KEY.size)) == []
    if kind == "rocks":  # the discard is durable: a reopened store is empty too
        store.close()
        sm = BrokerStateMachine(open_store(), Changes(), journaled=True)
        assert sm.applied_index() == 0 and sm.topic("t") is None
    sm.restore_snapshot(str(tmp_path / "snap"), 2)
    assert sm.applied_index() == 2 and sm.partition(1, 0).end_offset == 2
    res = sm.apply(3, append("t", 1, [1]))  # index 3 again, and this time a different command
    assert isinstance(res, Appended) and sm.partition(1, 1).end_offset == 1
    sm.store.close()
