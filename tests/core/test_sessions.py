"""Producer sessions by range in the state machine (SPEC §4, ``broker.core.sessions``): one check
and one write per batch; duplicates, partial overlaps, gaps, resets, restarts and old data."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from broker.core import dedup, sessions
from broker.core.applied import Appended, Rejected
from broker.core.errors import InvalidArgument, ResourceExhausted, SessionOutOfSequence
from broker.core.retention import Retention
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.storage import Column
from broker.storage.memory import MemoryStore
from broker.storage.rocks import RocksStore
from broker.v1 import internal_pb2

pytestmark = pytest.mark.unit

SESSION = "sdk-1"


def create(name: str = "t", partitions: int = 3, **config: Any) -> bytes:
    return internal_pb2.Command(create_topic=internal_pb2.CreateTopicCommand(
        config=internal_pb2.TopicConfig(name=name, partitions=partitions, **config), now_ms=1000)
    ).SerializeToString()


def batch(first: int, parts: list[int], *, dedup_id: str = SESSION, now_ms: int = 2000, tag: str = "",
          **extra: Any) -> bytes:
    bodies = [internal_pb2.RecordBody(value=b"%s%d" % (tag.encode(), first + i)).SerializeToString()
              for i in range(len(parts))]
    fields: dict[str, Any] = {"first_msg_id": first, **extra}
    return internal_pb2.Command(append=internal_pb2.AppendCommand(
        topic="t", topic_id=1, now_ms=now_ms, partitions=parts, bodies=bodies, dedup_id=dedup_id,
        **fields)).SerializeToString()


def reset(dedup_id: str = SESSION) -> bytes:
    return internal_pb2.Command(reset_watermark=internal_pb2.ResetWatermarkCommand(
        topic="t", topic_id=1, dedup_id=dedup_id)).SerializeToString()


class Machine:
    """A state machine with a topic ``t`` (3 partitions) and a Raft index that counts itself."""

    def __init__(self, store: object | None = None, sm: BrokerStateMachine | None = None, **config: Any) -> None:
        self.sm = sm or BrokerStateMachine(store if store is not None else MemoryStore(), Changes())  # type: ignore[arg-type]
        self.index = self.sm.applied_index()
        if self.sm.topic("t") is None:
            self.apply(create(**config))

    def apply(self, command: bytes) -> object:
        self.index += 1
        return self.sm.apply(self.index, command)

    def places(self, command: bytes) -> list[tuple[int, int, int, bool]]:
        result = self.apply(command)
        assert isinstance(result, Appended), result
        return result.placements

    def stored(self, partition: int) -> int:
        return self.sm.partition(1, partition).end_offset


def test_a_batch_stores_every_record_and_moves_the_watermark_to_its_last_id() -> None:
    m = Machine()
    placed = m.places(batch(1, [0, 1, 2, 0]))
    assert [(p, o, d) for p, o, _, d in placed] == [(0, 0, False), (1, 0, False), (2, 0, False), (0, 1, False)]
    assert dedup.watermark(m.sm.store, 1, SESSION) == 4
    assert list(dedup.watermarks(m.sm.store, 1)) == [(SESSION, 4)]
    placed = m.places(batch(5, [1, 1]))
    assert [(p, o, d) for p, o, _, d in placed] == [(1, 1, False), (1, 2, False)]
    assert dedup.watermark(m.sm.store, 1, SESSION) == 6


def test_a_retry_of_the_last_batch_stores_nothing_and_answers_the_original_places() -> None:
    m = Machine()
    m.places(batch(1, [2]))
    first = m.places(batch(2, [0, 1, 0, 2], now_ms=3000))
    ends = [m.stored(p) for p in range(3)]
    retry = m.places(batch(2, [1, 1, 1, 1], now_ms=9000))  # the retry's leader placed them elsewhere
    assert retry == [(p, o, ts, True) for p, o, ts, _ in first], "the original partition, offset and time"
    assert [m.stored(p) for p in range(3)] == ends
    assert dedup.watermark(m.sm.store, 1, SESSION) == 5


def test_a_retry_of_an_older_batch_is_a_duplicate_without_a_known_place() -> None:
    m = Machine()
    m.places(batch(1, [0, 0]))
    m.places(batch(3, [1]))
    assert m.places(batch(1, [2, 2])) == [(2, 0, 0, True), (2, 0, 0, True)], (
        "only the last batch's places are kept: older duplicates answer offset 0 like a watermark")
    assert m.stored(2) == 0


def test_a_partial_overlap_stores_only_the_new_tail() -> None:
    m = Machine()
    first = m.places(batch(1, [0, 1, 0]))
    placed = m.places(batch(2, [2, 2, 2, 2]))  # ids 2..5: 2 and 3 were stored, 4 and 5 are new
    assert placed[:2] == [(*first[1][:3], True), (*first[2][:3], True)]
    assert [(p, o, d) for p, o, _, d in placed[2:]] == [(2, 0, False), (2, 1, False)]
    assert dedup.watermark(m.sm.store, 1, SESSION) == 5
    again = m.places(batch(4, [0, 0]))  # a retry of the new tail: the remembered batch is ids 4..5
    assert again == [(p, o, ts, True) for p, o, ts, _ in placed[2:]]


def test_a_gap_is_refused_and_changes_nothing() -> None:
    m = Machine()
    m.places(batch(1, [0]))
    before = list(m.sm.store.scan(Column.DEDUP, b"", b"\xff" * 8))
    result = m.apply(batch(3, [0]))
    assert isinstance(result, Rejected) and isinstance(result.error, SessionOutOfSequence)
    assert "watermark is 1, so the next batch must start at 2" in str(result.error)
    assert list(m.sm.store.scan(Column.DEDUP, b"", b"\xff" * 8)) == before and m.stored(0) == 1


@pytest.mark.parametrize(("command", "message"), [
    (batch(1, [0], msg_ids=[1]), "takes no msg_id or idempotency_key"),
    (batch(1, [0], idempotency_keys=["k"]), "takes no msg_id or idempotency_key"),
    (batch(1, [0], dedup_id=""), "needs a dedup_id"),
    (batch(-4, [0]), "must be >= 1"),
    (batch(2**63 - 1, [0, 0]), "overflows"),
], ids=["msg_ids", "idempotency_keys", "no-dedup-id", "negative", "overflow"])
def test_a_malformed_session_batch_is_rejected_in_apply_without_raising(command: bytes, message: str) -> None:
    m = Machine()
    result = m.apply(command)
    assert isinstance(result, Rejected) and isinstance(result.error, InvalidArgument), result
    assert message in str(result.error)
    assert m.stored(0) == 0 and not list(dedup.watermarks(m.sm.store, 1))


def test_the_last_id_of_the_range_may_be_the_largest_int64() -> None:
    m = Machine()
    top = 2**63 - 1
    m.apply(reset())
    store = m.sm.store
    b = store.batch()
    dedup.set_watermark(b, 1, SESSION, top - 2)
    store.write(b)
    assert [d for *_, d in m.places(batch(top - 1, [0, 0]))] == [False, False]
    assert dedup.watermark(store, 1, SESSION) == top


def test_reset_watermark_lets_the_session_start_again_at_one() -> None:
    m = Machine()
    m.places(batch(1, [0, 0]))
    assert m.apply(reset()) is True, "the apply says there was a watermark"
    assert not list(dedup.watermarks(m.sm.store, 1))
    assert m.apply(reset()) is False, "and that there is none left"
    assert [d for *_, d in m.places(batch(1, [0]))] == [False], "stored again after the reset"
    assert m.stored(0) == 3


def test_a_refused_batch_does_not_move_the_watermark() -> None:
    """A batch refused after the session check (a full topic here) stores nothing, so its retry
    must be stored, not answered as a duplicate: session state is written with the records only."""
    store = MemoryStore()
    m = Machine(store, retention=internal_pb2.Retention(max_records=2),
                full_policy=internal_pb2.FULL_POLICY_REJECT)
    Retention(m.sm)
    m.places(batch(1, [0, 0]))
    full = m.apply(batch(3, [0]))
    assert isinstance(full, Rejected) and isinstance(full.error, ResourceExhausted), full
    assert dedup.watermark(store, 1, SESSION) == 2
    again = m.apply(batch(3, [1]))
    assert isinstance(again, Appended) and again.placements[0][3] is False


def test_the_per_record_form_moves_no_watermark_for_a_refused_batch() -> None:
    """The same rule for per-record msg_ids (it used to write the watermark before the refusal)."""
    store = MemoryStore()
    m = Machine(store, retention=internal_pb2.Retention(max_records=1),
                full_policy=internal_pb2.FULL_POLICY_REJECT)
    Retention(m.sm)
    m.places(batch(0, [0], first_msg_id=0, msg_ids=[1]))
    full = m.apply(batch(0, [0], first_msg_id=0, msg_ids=[2]))
    assert isinstance(full, Rejected), full
    assert dedup.watermark(store, 1, SESSION) == 1, "the refused id 2 is not marked as seen"


def test_both_forms_share_one_watermark_per_dedup_id() -> None:
    m = Machine()
    m.places(batch(1, [0, 0]))
    per_record = m.places(batch(0, [1, 1], first_msg_id=0, msg_ids=[2, 3]))
    assert [d for *_, d in per_record] == [True, False]
    assert dedup.watermark(m.sm.store, 1, SESSION) == 3
    assert [d for *_, d in m.places(batch(3, [2, 2]))] == [True, False]


def test_session_state_survives_a_restart_over_the_same_store(tmp_path: Path) -> None:
    m = Machine(RocksStore(tmp_path / "db"))
    first = m.places(batch(1, [0, 2, 1, 2]))
    m.sm.store.close()
    again = Machine(RocksStore(tmp_path / "db"))
    assert again.index == m.index
    assert again.places(batch(1, [0, 0, 0, 0])) == [(p, o, ts, True) for p, o, ts, _ in first]
    assert [d for *_, d in again.places(batch(5, [1]))] == [False]


def test_a_watermark_written_before_sessions_by_range_is_read_as_a_bare_watermark() -> None:
    """Old data directories: an 8-byte watermark is the session's watermark with no kept places."""
    m = Machine()
    b = m.sm.store.batch()
    b.put(Column.DEDUP, dedup.watermark_key(1, SESSION), struct.pack(">q", 3))
    m.sm.store.write(b)
    assert m.places(batch(3, [1, 1])) == [(1, 0, 0, True), (1, 0, 2000, False)]
    assert dedup.watermark(m.sm.store, 1, SESSION) == 4


@pytest.mark.parametrize("parts", [[5], [0, 1, 0, 2], list(range(300)) * 2, [70_000, 3, 70_000]])
def test_the_stored_placement_round_trips(parts: list[int]) -> None:
    starts = {p: (p * 10, 1234 + p) for p in set(parts)}
    state = sessions.decode(sessions.encode(7 + len(parts) - 1, 7, parts, starts))
    assert state.mark == 6 + len(parts) and state.last is not None
    expected, nxt = [], {p: o for p, (o, _) in starts.items()}
    for p in parts:
        expected.append((p, nxt[p], starts[p][1]))
        nxt[p] += 1
    assert state.last.places(7, len(parts)) == expected
    assert state.last.places(8, len(parts) - 1) == expected[1:]
    assert state.last.places(6, 1) is None


def test_a_malformed_stored_value_is_a_bare_watermark() -> None:
    raw = sessions.encode(9, 8, [0, 1], {0: (0, 1), 1: (0, 1)})
    assert sessions.decode(raw[:-1]) == sessions.SessionState(9, None)


def test_session_state_travels_in_a_snapshot(tmp_path: Path) -> None:
    m = Machine(RocksStore(tmp_path / "db"))
    first = m.places(batch(1, [1, 0, 1]))
    m.sm.write_snapshot(str(tmp_path / "snap"))
    restored = BrokerStateMachine(RocksStore(tmp_path / "db2"), Changes())
    restored.restore_snapshot(str(tmp_path / "snap"), m.index)
    other = Machine(sm=restored)
    assert other.index == m.index
    assert other.places(batch(1, [2, 2, 2])) == [(p, o, ts, True) for p, o, ts, _ in first]
    assert dedup.watermark(restored.store, 1, SESSION) == 3


def expire(now_ms: int) -> bytes:
    return internal_pb2.Command(expire_dedup=internal_pb2.ExpireDedupCommand(now_ms=now_ms)).SerializeToString()


def test_sessions_by_range_idle_past_the_window_are_forgotten_and_watermarks_are_not() -> None:
    m = Machine(dedup_window_ms=60_000)
    m.places(batch(1, [0], dedup_id="idle", now_ms=10_000))
    m.places(batch(1, [0], dedup_id="busy", now_ms=10_000))
    m.places(batch(0, [0], dedup_id="standby", now_ms=10_000, first_msg_id=0, msg_ids=[1]))
    m.apply(expire(70_000))  # 60 s after: still inside the window
    assert dict(dedup.watermarks(m.sm.store, 1)) == {"busy": 1, "idle": 1, "standby": 1}
    m.places(batch(2, [0], dedup_id="busy", now_ms=65_000))
    m.apply(expire(70_001))
    assert dict(dedup.watermarks(m.sm.store, 1)) == {"busy": 2, "standby": 1}, (
        "the idle session by range is forgotten; a per-record watermark is permanent")
    late = m.apply(batch(2, [0], dedup_id="idle", now_ms=80_000))
    assert isinstance(late, Rejected) and isinstance(late.error, SessionOutOfSequence), (
        "a forgotten session's next batch is refused (nothing stored); the SDK opens a new session")


def test_sessions_of_a_forever_topic_never_expire() -> None:
    m = Machine(dedup_window_ms=-1)
    m.places(batch(1, [0], now_ms=10_000))
    m.apply(expire(10**12))
    assert dict(dedup.watermarks(m.sm.store, 1)) == {SESSION: 1}


def test_last_used_is_the_newest_partition_time_of_the_last_batch() -> None:
    raw = sessions.encode(9, 8, [0, 1], {0: (0, 100), 1: (5, 250)})
    assert sessions.last_used_ms(raw) == 250
    assert sessions.last_used_ms(struct.pack(">q", 9)) is None
