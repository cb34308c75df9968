"""One stored value per applied batch (``broker.core.record_log``), on MemoryStore and RocksStore:
reads at every offset inside and across batches, cuts inside a batch (retention, prune, clear),
damaged records and headers, snapshots, and the upgrade of a store written one value per record."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.core import errors, record_log, records
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.reading import Reader
from broker.services import wire
from broker.storage import Batch, Column, StorageFailure, Store
from broker.storage.memory import MemoryStore
from broker.storage.rocks import RocksStore
from broker.v1 import broker_pb2, common_pb2, internal_pb2
from tests.core.groups_env import Env, make_env
from tests.record_store import damage_table, flip_record_byte, frame_span, put_format1, stored_values, value_format

pytestmark = pytest.mark.unit
CAP = record_log.STORED_BATCH_RECORDS_MAX
SIZES = (1, 7, 1000, CAP + 1, 3)  # publishes of odd sizes, one above the stored-value cap
Item = internal_pb2.Record | internal_pb2.Event


def open_store(kind: str, path: Path) -> Store:
    return RocksStore(path) if kind == "rocks" else MemoryStore()


@pytest.fixture(params=["memory", "rocks"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def env(kind: str, tmp_path: Path) -> Iterator[Env]:
    store = open_store(kind, tmp_path / "db")
    e = make_env(BrokerStateMachine(store, Changes()))
    yield e
    e.replicator.close()
    store.close()


def value_of(i: int) -> bytes:
    return b"v%d-" % i + b"x" * (i % 37)  # bodies of different sizes


def publish(env: Env, topic: str, first: int, n: int, partition: int = 0) -> None:
    env.publish(topic, [value_of(first + i) for i in range(n)], partition=partition)


def tid_of(env: Env, topic: str) -> int:
    meta = env.state.topic(topic)
    assert meta is not None
    return meta.topic_id


def value(entry: record_log.Entry) -> bytes:
    assert entry.error is None, entry.error
    return internal_pb2.RecordBody.FromString(entry.body).value


def subscribe(env: Env, topic: str, start: int, max_batch: int = 0) -> list[list[Item]]:
    """The responses of a stop-at-end subscription: each a list of records or one event."""
    request = broker_pb2.SubscribeRequest(topic=topic, partition=0, stop_at_end=True, max_batch=max_batch,
                                          **{"from": common_pb2.Position(offset=start)})
    out: list[list[Item]] = []
    for item in Reader(env.state).subscribe(wire.subscription(request), lambda: True):
        out.append(list(item.batch.records) if item.HasField("batch") else [item.event])
    return out


def flat(responses: list[list[Item]]) -> list[Item]:
    return [item for response in responses for item in response]


def check_counters(env: Env, tid: int, partition: int = 0) -> list[record_log.Entry]:
    """The partition's records/bytes counters are exactly those of its readable records."""
    st = env.state.partition(tid, partition)
    live = list(record_log.read(env.state.store, tid, partition, st.start_offset, st.end_offset))
    assert [e.offset for e in live] == list(range(st.start_offset, st.end_offset))
    assert st.records == len(live) and st.bytes == sum(len(e.body) for e in live)
    return live


def test_reads_at_every_offset_inside_and_across_batches(env: Env) -> None:
    env.topic("t")
    first = 0
    for n in SIZES:
        publish(env, "t", first, n)
        first += n
    tid, store, end = tid_of(env, "t"), env.state.store, first
    assert stored_values(store, tid, 0) == [(0, 1), (1, 7), (8, 1000), (1008, CAP), (1008 + CAP, 1),
                                            (1009 + CAP, 3)], "one value per applied batch, split at the cap"
    for o in range(end):
        got = list(record_log.read(store, tid, 0, o, end, 3))  # a limit counted in records, across values
        assert [e.offset for e in got] == list(range(o, min(o + 3, end)))
        assert [value(e) for e in got] == [value_of(i) for i in range(o, min(o + 3, end))]
        point = record_log.get(store, tid, 0, o, 0)
        assert point is not None and value(point) == value_of(o)
    assert record_log.get(store, tid, 0, end, 0) is None
    assert [value(e) for e in record_log.read(store, tid, 0, 0, end)] == [value_of(i) for i in range(end)]
    boundaries = {0, 1, 8, 1008, 1008 + CAP, 1009 + CAP}
    for start in sorted({b + d for b in boundaries for d in (-1, 0, 1)} & set(range(end))):
        responses = subscribe(env, "t", start, max_batch=7)
        assert all(len(r) <= 7 for r in responses)
        got_records = flat(responses)
        assert [r.offset for r in got_records] == list(range(start, end))
        assert [r.value for r in got_records] == [value_of(i) for i in range(start, end)]
    check_counters(env, tid)


def test_large_records_split_stored_values_by_bytes(env: Env) -> None:
    env.topic("big")
    big = record_log.STORED_BATCH_BYTES_MAX // 3
    bodies = [bytes([i]) * big for i in range(5)] + [b"z" * (record_log.STORED_BATCH_BYTES_MAX + 10), b"tail"]
    env.publish("big", bodies)
    tid = tid_of(env, "big")
    assert stored_values(env.state.store, tid, 0) == [(0, 2), (2, 2), (4, 1), (5, 1), (6, 1)]
    assert [value(e) for e in record_log.read(env.state.store, tid, 0, 0, 7)] == bodies
    check_counters(env, tid)


def test_a_value_is_filled_to_the_byte_cap_exactly_with_every_element_prefix_width(env: Env) -> None:
    """``record_log.append`` places the cut where the next element would pass the byte cap (an
    element is its 1-byte tag, its length's varint and the body) and writes 2-, 3- and 4-byte
    prefixes (body lengths around 127 and 16383) as they are read back."""
    store = env.state.store
    cap = record_log.STORED_BATCH_BYTES_MAX
    first = 100_000  # element 1 + 3 + 100000
    second = cap - (1 + 3 + first) - (1 + 3)  # fills the value exactly
    lengths = [first, second, 0, 127, 128, 16383, 16384, 1]
    bodies = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    batch = store.batch()
    record_log.append(batch, 9, 0, 40, 1234, bodies)
    store.write(batch)
    assert stored_values(store, 9, 0) == [(40, 2), (42, 6)]
    got = list(record_log.read(store, 9, 0, 40, 48))
    assert [(e.offset, e.error, e.timestamp_ms) for e in got] == [(40 + i, None, 1234) for i in range(8)]
    assert [e.body for e in got] == bodies
    batch = store.batch()
    record_log.append(batch, 9, 1, 0, 5, [b"x" * first, b"y" * (second + 1)])  # one byte over: the second moves on
    record_log.append(batch, 9, 1, 2, 6, [])  # nothing to write
    store.write(batch)
    assert stored_values(store, 9, 1) == [(0, 1), (1, 1)]


def test_time_index_searches_batches(env: Env) -> None:
    env.topic("t")
    stamps = []
    for i, n in enumerate((1, 7, 30, 2)):
        env.clock.advance(1000 * (i + 1))
        publish(env, "t", sum((1, 7, 30, 2)[:i]), n)
        stamps.append(env.clock.now_ms())
    tid = tid_of(env, "t")
    firsts = [0, 1, 8, 38]
    for ts, first in zip(stamps, firsts, strict=True):
        assert record_log.offset_for_time(env.state.store, tid, 0, ts, 0, 40) == first
        assert record_log.offset_for_time(env.state.store, tid, 0, ts - 1, 0, 40) == first
        assert record_log.timestamp_at(env.state.store, tid, 0, first) == ts
    assert record_log.offset_for_time(env.state.store, tid, 0, stamps[-1] + 1, 0, 40) == 40


def cut_setup(env: Env, **retention: int) -> int:
    env.log.create_topic(internal_pb2.TopicConfig(name="t", retention=internal_pb2.Retention(**retention)))
    publish(env, "t", 0, 10)
    return tid_of(env, "t")


def expect_skip_then(env: Env, start: int, end: int) -> None:
    items = flat(subscribe(env, "t", 0))
    skip = items[0]
    assert isinstance(skip, internal_pb2.Event) and skip.type == common_pb2.EVENT_TYPE_SKIP_FORWARD
    assert (skip.offset_before, skip.offset_after) == (0, start)
    assert [r.offset for r in items[1:]] == list(range(start, end))
    assert [r.value for r in items[1:]] == [value_of(i) for i in range(start, end)]


def test_retention_by_count_cuts_inside_a_batch(env: Env) -> None:
    tid = cut_setup(env, max_records=15)
    publish(env, "t", 10, 10)  # discard_old: the cut at 5 lies inside the first stored value
    st = env.state.partition(tid, 0)
    assert (st.start_offset, st.end_offset, st.records) == (5, 20, 15)
    assert stored_values(env.state.store, tid, 0) == [(0, 10), (10, 10)], "the straddling value stays"
    check_counters(env, tid)
    expect_skip_then(env, 5, 20)
    publish(env, "t", 20, 13)  # a cut inside the batch written by the same apply
    st = env.state.partition(tid, 0)
    assert (st.start_offset, st.records) == (18, 15)
    assert stored_values(env.state.store, tid, 0) == [(10, 10), (20, 13)]
    check_counters(env, tid)
    expect_skip_then(env, 18, 33)


def test_retention_by_bytes_cuts_inside_a_batch(env: Env) -> None:
    tid = cut_setup(env)
    sizes = [len(e.body) for e in record_log.read(env.state.store, tid, 0, 0, 10)]
    cap = sum(sizes[3:]) + 5 * 1000  # keeps offsets 3.. once five more records of <1000 bytes come
    env.log.alter_topic("t", internal_pb2.Retention(max_bytes=sum(sizes[3:])), internal_pb2.FULL_POLICY_UNSPECIFIED)
    env.log.enforce_retention()
    st = env.state.partition(tid, 0)
    assert (st.start_offset, st.bytes) == (3, sum(sizes[3:]))
    check_counters(env, tid)
    expect_skip_then(env, 3, 10)
    env.log.alter_topic("t", internal_pb2.Retention(max_bytes=cap), internal_pb2.FULL_POLICY_UNSPECIFIED)
    publish(env, "t", 10, 5)
    check_counters(env, tid)
    assert env.state.partition(tid, 0).bytes <= cap


def test_retention_by_age_removes_the_rest_of_a_straddling_batch(env: Env) -> None:
    """An age cut falls between applies (one apply, one timestamp); it must count the records of
    a value an earlier cut left straddling exactly."""
    tid = cut_setup(env)
    env.log.prune("t", 0, 4)
    env.clock.advance(30_000)
    publish(env, "t", 10, 5)
    env.log.alter_topic("t", internal_pb2.Retention(max_age_ms=20_000), internal_pb2.FULL_POLICY_UNSPECIFIED)
    env.clock.advance(10_000)
    env.log.enforce_retention()
    st = env.state.partition(tid, 0)
    assert (st.start_offset, st.records) == (10, 5)
    assert stored_values(env.state.store, tid, 0) == [(10, 5)]
    check_counters(env, tid)
    expect_skip_then(env, 10, 15)


def test_prune_and_clear_cut_inside_batches(env: Env) -> None:
    tid = cut_setup(env)
    publish(env, "t", 10, 10)
    assert env.log.prune("t", 0, 13) == 13
    assert stored_values(env.state.store, tid, 0) == [(10, 10)]
    check_counters(env, tid)
    expect_skip_then(env, 13, 20)
    assert record_log.get(env.state.store, tid, 0, 12, env.state.partition(tid, 0).start_offset) is None
    assert env.log.prune("t", 0, 11) == 0, "never moves backwards"
    assert env.log.clear_topic("t") == 7
    st = env.state.partition(tid, 0)
    assert (st.start_offset, st.end_offset, st.records, st.bytes) == (20, 20, 0, 0)
    assert stored_values(env.state.store, tid, 0) == []
    publish(env, "t", 20, 3)
    check_counters(env, tid)
    expect_skip_then(env, 20, 23)


def test_protect_and_lead_groups_hold_a_cut_inside_a_batch(env: Env) -> None:
    tid = cut_setup(env)
    env.group("t", "guard")
    env.group("t", "lead")
    env.ops.mark("t", "guard", internal_pb2.PRUNE_ROLE_PROTECT)
    env.ops.mark("t", "lead", internal_pb2.PRUNE_ROLE_LEAD)
    env.ops.seek("t", "guard", internal_pb2.Position(offset=4), None)
    env.ops.seek("t", "lead", internal_pb2.Position(offset=6), None)
    with pytest.raises(errors.FailedPrecondition, match="protects partition 0 from offset 4"):
        env.log.prune("t", 0, 0, group="lead")
    assert env.state.partition(tid, 0).start_offset == 0, "nothing of a refused prune is deleted"
    assert env.log.prune("t", 0, 4) == 4
    check_counters(env, tid)
    env.ops.mark("t", "guard", internal_pb2.PRUNE_ROLE_NONE)
    assert env.log.prune("t", None, 0, group="lead") == 2
    check_counters(env, tid)
    rt = env.service.ensure("t", "guard", internal_pb2.GroupConfig())
    delivery = env.pick(rt, rt.open_stream())
    assert [r.offset for r in delivery.records] == list(range(6, 10))
    assert [e.type for e in delivery.events] == [common_pb2.EVENT_TYPE_SKIP_FORWARD]


def test_a_corrupt_record_inside_a_batch_is_badmsg_alone(env: Env) -> None:
    env.topic("t")
    publish(env, "t", 0, 7)
    tid = tid_of(env, "t")
    flip_record_byte(env.state.store, tid, 0, 3)
    assert [e.error for e in record_log.read(env.state.store, tid, 0, 0, 7)] == [None] * 3 + ["checksum mismatch"] + [
        None] * 3
    responses = subscribe(env, "t", 0)
    assert [[r.offset for r in resp] for resp in responses if isinstance(resp[0], internal_pb2.Record)] == [
        [0, 1, 2], [4, 5, 6]]
    [[bad]] = [resp for resp in responses if isinstance(resp[0], internal_pb2.Event)]
    assert isinstance(bad, internal_pb2.Event) and bad.type == common_pb2.EVENT_TYPE_BADMSG
    assert (bad.offset_before, bad.offset_after) == (3, 4) and "checksum mismatch" in bad.detail
    rt = env.group("t", "g")
    delivery = env.pick(rt, rt.open_stream())
    assert sorted(r.offset for r in delivery.records) == [0, 1, 2, 4, 5, 6]
    assert [(e.type, e.offset_before) for e in delivery.events] == [(common_pb2.EVENT_TYPE_BADMSG, 3)]


def test_a_damaged_batch_header_reports_every_offset_of_that_batch(env: Env) -> None:
    env.topic("t")
    for first, n in ((0, 1), (1, 7), (8, 2)):
        publish(env, "t", first, n)
    tid = tid_of(env, "t")
    damage_table(env.state.store, tid, 0, 4)
    items = flat(subscribe(env, "t", 0))
    assert [r.offset for r in items if isinstance(r, internal_pb2.Record)] == [0, 8, 9]
    bad = [e for e in items if isinstance(e, internal_pb2.Event)]
    assert [(e.type, e.offset_before, e.offset_after) for e in bad] == [
        (common_pb2.EVENT_TYPE_BADMSG, o, o + 1) for o in range(1, 8)]
    assert all("batch header checksum mismatch" in e.detail for e in bad)
    assert [e.offset_before for e in flat(subscribe(env, "t", 5)) if isinstance(e, internal_pb2.Event)] == [5, 6, 7]
    point = record_log.get(env.state.store, tid, 0, 4, 0)
    assert point is not None and point.error == "batch header checksum mismatch"
    assert record_log.timestamp_at(env.state.store, tid, 0, 4) is None
    assert record_log.offset_for_time(env.state.store, tid, 0, 0, 0, 10) in (0, 8)
    assert env.log.prune("t", 0, 5) == 5, "a cut inside the damaged value still works"
    assert env.state.partition(tid, 0).records == 5


def test_snapshot_and_restore_with_batched_values(kind: str, tmp_path: Path) -> None:
    source = make_env(BrokerStateMachine(open_store(kind, tmp_path / "a"), Changes()))
    source.topic("t", 2)
    for p in (0, 1):
        publish(source, "t", 0, 30, partition=p)
        publish(source, "t", 30, CAP + 1, partition=p)
    source.log.prune("t", 0, 17)
    source.state.write_snapshot(str(tmp_path / "snap"))
    target_store = open_store(kind, tmp_path / "b")
    target = BrokerStateMachine(target_store, Changes())
    target.restore_snapshot(str(tmp_path / "snap"), source.state.applied_index())
    tid = tid_of(source, "t")
    for p in (0, 1):
        st = target.partition(tid, p)
        assert st == source.state.partition(tid, p)
        assert list(record_log.read(target_store, tid, p, st.start_offset, st.end_offset)) == list(
            record_log.read(source.state.store, tid, p, st.start_offset, st.end_offset))
    assert target.partition(tid, 0).start_offset == 17
    source.replicator.close()
    source.state.store.close()
    target_store.close()


# -- upgrade of a format-1 store ------------------------------------------------------------------
def format1_copy(source: BrokerStateMachine, store: Store) -> None:
    """Write into ``store`` what the code before format 2 would hold for the same state: META as is
    (no format key), one value per readable record."""
    batch = store.batch()
    for key, raw in source.store.scan(Column.META, b"", b"\xff" * 32):
        if key != record_log.FORMAT_KEY:
            batch.put(Column.META, key, raw)
    for meta in source.topics():
        for p in range(meta.config.partitions):
            st = source.partition(meta.topic_id, p)
            for e in record_log.read(source.store, meta.topic_id, p, st.start_offset, st.end_offset):
                put_format1(batch, meta.topic_id, p, e.offset, e.timestamp_ms, e.body)
    store.write(batch)


def same_reads(a: Store, b: Store, tid: int, start: int, end: int) -> None:
    """Identical reads from every offset the partition holds (``[start, end)``)."""
    for o in range(start, end):
        assert list(record_log.read(a, tid, 0, o, end, 4)) == list(record_log.read(b, tid, 0, o, end, 4))
        assert record_log.get(a, tid, 0, o, start) == record_log.get(b, tid, 0, o, start)
    assert len(list(record_log.read(b, tid, 0, start, end))) == end - start


def reference(tmp_path: Path) -> Env:
    env = make_env()
    env.topic("t")
    for first, n in ((0, 1), (1, 7), (8, 30), (38, 5)):
        env.clock.advance(1000)
        publish(env, "t", first, n)
    env.log.prune("t", 0, 3)
    return env


def test_a_format1_store_is_upgraded_on_open_with_identical_reads(kind: str, tmp_path: Path) -> None:
    ref = reference(tmp_path)
    tid = tid_of(ref, "t")
    old = open_store(kind, tmp_path / "old")
    format1_copy(ref.state, old)
    assert old.get(Column.META, record_log.FORMAT_KEY) is None
    upgraded = make_env(BrokerStateMachine(old, Changes()))  # opening upgrades
    assert old.get(Column.META, record_log.FORMAT_KEY) == bytes([record_log.FORMAT_V2])
    assert stored_values(old, tid, 0) == [(o, 1) for o in range(3, 43)], "each old value: a batch of one"
    same_reads(ref.state.store, old, tid, 3, 43)
    third = record_log.timestamp_at(old, tid, 0, 8)  # the third publish's timestamp
    assert third is not None and third == record_log.timestamp_at(ref.state.store, tid, 0, 8)
    assert record_log.offset_for_time(old, tid, 0, third, 3, 43) == 8
    assert record_log.upgrade(old) == 0, "a second open rewrites nothing"
    publish(upgraded, "t", 43, 4)
    check_counters(upgraded, tid)
    expect_skip_then(upgraded, 3, 47)
    upgraded.replicator.close()
    old.close()


class _FailingWrites(MemoryStore):
    """A MemoryStore whose ``fail_at``-th write raises (a crash in the middle of an upgrade)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def write(self, batch: Batch, *, sync: bool = False, wal: bool = True) -> None:
        self.fail_at -= 1
        if self.fail_at == 0:
            raise StorageFailure("injected failure")
        super().write(batch, sync=sync, wal=wal)


def test_an_interrupted_upgrade_resumes_where_it_stopped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ref = reference(tmp_path)
    tid = tid_of(ref, "t")
    old = _FailingWrites(fail_at=4)  # the load, then two chunks, then the failure
    format1_copy(ref.state, old)
    monkeypatch.setattr(record_log, "UPGRADE_CHUNK_RECORDS", 7)
    with pytest.raises(StorageFailure):
        record_log.upgrade(old)
    assert old.get(Column.META, record_log.FORMAT_KEY) is None
    assert record_log.upgrade(old) == 40 - 14
    same_reads(ref.state.store, old, tid, 3, 43)


def test_a_format1_snapshot_is_upgraded_after_restore(kind: str, tmp_path: Path) -> None:
    ref = reference(tmp_path)
    tid = tid_of(ref, "t")
    old = open_store(kind, tmp_path / "old")
    format1_copy(ref.state, old)
    old.checkpoint(str(tmp_path / "snap"))
    target_store = open_store(kind, tmp_path / "new")
    target = BrokerStateMachine(target_store, Changes())
    target.restore_snapshot(str(tmp_path / "snap"), ref.state.applied_index())
    assert target.partition(tid, 0) == ref.state.partition(tid, 0)
    same_reads(ref.state.store, target_store, tid, 3, 43)
    old.close()
    target_store.close()


def test_record_keys_of_a_value_are_its_last_offset() -> None:
    key, raw = record_log.encode(3, 1, 10, [records.frame(records.record_key(3, 1, o), 5, b"b") for o in (10, 11)])
    assert records.RECORD_KEY.unpack(key) == (3, 1, 11)
    store = MemoryStore()
    batch = store.batch()
    batch.put(Column.RECORDS, key, raw)
    store.write(batch)
    assert [(e.offset, e.timestamp_ms, e.body) for e in record_log.read(store, 3, 1, 0, 100)] == [
        (10, 5, b"b"), (11, 5, b"b")]


def test_an_intact_format3_value_reads_as_one_span_and_a_damaged_one_record_by_record(env: Env) -> None:
    env.topic("t")
    publish(env, "t", 0, 6)
    publish(env, "t", 6, 3)
    tid = tid_of(env, "t")
    store = env.state.store
    assert value_format(store, tid, 0, 0) == 3
    spans = list(record_log.read_spans(store, tid, 0, 2, 9))
    assert [(s.first, s.count) for s in spans if isinstance(s, record_log.Span)] == [(2, 4), (6, 3)]
    entries = list(record_log.entries_of(iter(spans)))
    assert entries == list(record_log.read(store, tid, 0, 2, 9))
    assert [e.body for e in entries] == [e.body for e in record_log.read(store, tid, 0, 2, 9)]
    assert [internal_pb2.RecordBody.FromString(e.body).value for e in entries] == [value_of(i) for i in range(2, 9)]
    flip_record_byte(store, tid, 0, 1)
    items = list(record_log.read_spans(store, tid, 0, 0, 9))
    assert [type(i).__name__ for i in items] == ["Entry"] * 6 + ["Span"], "the damaged value is read record by record"
    assert [i.error for i in items[:6] if isinstance(i, record_log.Entry)] == [
        None, "checksum mismatch", None, None, None, None]


def test_a_flipped_record_crc_in_a_format3_header_is_a_damaged_header(env: Env) -> None:
    env.topic("t")
    publish(env, "t", 0, 4)
    tid = tid_of(env, "t")
    store = env.state.store
    [(key, value)] = list(store.scan(Column.RECORDS, records.record_key(tid, 0, 0), records.record_key(tid, 1, 0)))
    at = 13 + 4 * 4 + 2  # the third byte of the first record's CRC (after the header and the ends)
    batch = store.batch()
    batch.put(Column.RECORDS, key, value[:at] + bytes([value[at] ^ 0x10]) + value[at + 1:])
    store.write(batch, sync=True)
    assert {e.error for e in record_log.read(store, tid, 0, 0, 4)} == {"batch header checksum mismatch"}


def test_format2_and_format3_values_read_alike_side_by_side(env: Env) -> None:
    env.topic("t")
    publish(env, "t", 0, 5)
    tid = tid_of(env, "t")
    store = env.state.store
    before = list(record_log.read(store, tid, 0, 0, 5))
    batch = store.batch()
    batch.put(Column.RECORDS, *record_log.encode(tid, 0, 0, [
        records.frame(records.record_key(tid, 0, e.offset), e.timestamp_ms, e.body) for e in before]))
    store.write(batch, sync=True)
    publish(env, "t", 5, 5)
    assert (value_format(store, tid, 0, 0), value_format(store, tid, 0, 5)) == (2, 3)
    after = list(record_log.read(store, tid, 0, 0, 10))
    assert after[:5] == before and [e.error for e in after] == [None] * 10
    assert [o for o, _ in record_log.sizes(store, tid, 0, 0, 10)] == list(range(10))
    assert [n for _, n in record_log.sizes(store, tid, 0, 0, 10)] == [len(e.body) for e in after]
    assert [record_log.timestamp_at(store, tid, 0, o) for o in range(10)] == [e.timestamp_ms for e in after]
    assert [r.value for r in flat(subscribe(env, "t", 0)) if isinstance(r, internal_pb2.Record)] == [
        value_of(i) for i in range(10)]
    assert [r.offset for r in flat(subscribe(env, "t", 3)) if isinstance(r, internal_pb2.Record)] == list(range(3, 10))


def test_a_point_read_in_a_large_value_checks_its_own_record(env: Env) -> None:
    """A few records of a large value are checked one by one (no CRC over the whole value): damage
    is still found, and only where it is."""
    env.topic("t")
    publish(env, "t", 0, 200)
    tid = tid_of(env, "t")
    flip_record_byte(env.state.store, tid, 0, 50)
    bad = record_log.get(env.state.store, tid, 0, 50, 0)
    assert bad is not None and bad.error == "checksum mismatch"
    for offset in (0, 49, 51, 199):
        good = record_log.get(env.state.store, tid, 0, offset, 0)
        assert good is not None and good.error is None
        assert internal_pb2.RecordBody.FromString(good.body).value == value_of(offset)
    whole = list(record_log.read(env.state.store, tid, 0, 0, 200))
    assert [e.offset for e in whole if e.error] == [50]


class _Released(MemoryStore):
    """A MemoryStore that lists the ranges readers said they had passed."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[tuple[Column, bytes, bytes]] = []

    def release_pages(self, column: Column, low: bytes, high: bytes) -> None:
        self.released.append((column, low, high))


def test_a_read_from_an_offset_tells_the_store_what_lies_behind_it() -> None:
    """A read of a partition from offset ``begin``, at least ``PASSING_MIN_RECORDS`` before the end
    it reads to, hints the store that the partition's keys below ``begin`` are passed
    (``Store.release_pages``: drop-behind for readers going through a topic); a read from the start,
    one nearer the head (a reader keeping up), a lookup of one record and a time-index probe hint
    nothing. Each reads the same records."""
    store = _Released()
    n = 3 * record_log.PASSING_MIN_RECORDS
    batch = store.batch()
    record_log.append(batch, 9, 1, 0, 5, [b"r%d" % i for i in range(n)])
    store.write(batch)
    assert [e.offset for e in record_log.read(store, 9, 1, 0, n, 10)] == list(range(10))
    near = n - record_log.PASSING_MIN_RECORDS + 1
    assert [e.offset for e in record_log.read(store, 9, 1, near, n, 10)] == list(range(near, near + 10))
    assert [e.offset for e in record_log.read(store, 9, 1, 6, 7)] == [6]
    assert record_log.timestamp_at(store, 9, 1, 7) == 5
    assert record_log.offset_for_time(store, 9, 1, 5, 0, n) == 0
    assert store.released == []
    assert [e.offset for e in record_log.read(store, 9, 1, near - 1, n, 3)] == [near - 1, near, near + 1]
    assert sum(1 for _ in record_log.read_spans(store, 9, 1, 1000, n, 5)) >= 1
    key = records.RECORD_KEY.pack
    assert store.released == [(Column.RECORDS, key(9, 1, 0), key(9, 1, near - 1)),
                              (Column.RECORDS, key(9, 1, 0), key(9, 1, 1000))]


def test_skeletons_answer_sizes_and_timestamps_as_the_values_they_shadow() -> None:
    """A `memory` topic's skeletons (format 4, in the durable store under the values' keys) answer
    every size and timestamp question its values do, for odd batch sizes and bodies of every
    element-prefix width; a read of records from them reports each offset; a damaged one says so."""
    values, skeletons = MemoryStore(), MemoryStore()
    bodies = [b"x" * n for n in (0, 1, 127, 128, 16383, 16384, 300_000)] + [b"y%d" % i for i in range(CAP + 5)]
    first, ts = 0, 1000
    for chunk in (bodies[:3], bodies[3:7], bodies[7:]):
        vb, sb = values.batch(), skeletons.batch()
        record_log.append(vb, 9, 2, first, ts, chunk, sb)
        values.write(vb)
        skeletons.write(sb)
        first, ts = first + len(chunk), ts + 10
    end = first
    assert [k for k, _ in skeletons.scan(Column.RECORDS, b"", b"\xff" * 16)] == \
        [k for k, _ in values.scan(Column.RECORDS, b"", b"\xff" * 16)]
    for lo, hi in ((0, end), (2, 9), (5, 6), (8, end - 3)):
        assert list(record_log.sizes(skeletons, 9, 2, lo, hi)) == list(record_log.sizes(values, 9, 2, lo, hi))
    for offset in range(end):
        assert record_log.timestamp_at(skeletons, 9, 2, offset) == record_log.timestamp_at(values, 9, 2, offset)
    for when in (999, 1000, 1001, 1010, 1020, 1021):
        assert record_log.offset_for_time(skeletons, 9, 2, when, 0, end) == \
            record_log.offset_for_time(values, 9, 2, when, 0, end)
    assert [(e.offset, e.error) for e in record_log.read(skeletons, 9, 2, 1, 3)] == \
        [(1, "a skeleton holds no record"), (2, "a skeleton holds no record")]
    key, raw = next(iter(skeletons.scan(Column.RECORDS, b"", b"\xff" * 16)))
    damaged = skeletons.batch()
    damaged.put(Column.RECORDS, key, raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:])
    skeletons.write(damaged)
    assert list(record_log.sizes(skeletons, 9, 2, 0, 3)) == [(0, 0), (1, 0), (2, 0)]
    assert record_log.timestamp_at(skeletons, 9, 2, 1) is None


def test_an_even_skeleton_spreads_its_bytes_and_stamps_every_record_alike() -> None:
    """The skeleton the rise to format 5 writes for a `memory` partition's older records."""
    store = MemoryStore()
    batch = store.batch()
    record_log.put_even_skeleton(batch, 3, 1, 10, 7, 100, 5000)  # 100 bytes over 7 records: 15, 15, 14 x 5
    store.write(batch)
    assert list(record_log.sizes(store, 3, 1, 10, 17)) == [(10, 15), (11, 15)] + [(o, 14) for o in range(12, 17)]
    assert [record_log.bytes_in(store, 3, 1, lo, hi) for lo, hi in ((10, 17), (11, 13), (12, 17), (16, 30))] == \
        [100, 29, 70, 14]
    assert {record_log.timestamp_at(store, 3, 1, o) for o in range(10, 17)} == {5000}
    assert record_log.offset_for_time(store, 3, 1, 5000, 10, 17) == 10
    assert record_log.offset_for_time(store, 3, 1, 5001, 10, 17) == 17
    key, raw = next(iter(store.scan(Column.RECORDS, b"", b"\xff" * 16)))
    damaged = store.batch()
    damaged.put(Column.RECORDS, key, raw[:14] + bytes([raw[14] ^ 1]) + raw[15:])  # the byte total
    store.write(damaged)
    assert list(record_log.sizes(store, 3, 1, 10, 12)) == [(10, 0), (11, 0)]
    assert record_log.bytes_in(store, 3, 1, 10, 17) == 0


def test_byte_counts_and_byte_cuts_sum_per_value_as_record_by_record() -> None:
    """``bytes_in`` and ``cut_for_bytes`` sum whole values without a step per record (a prune or a
    retention cut of millions of records runs in one apply); they must count exactly what
    ``sizes`` counts record by record, for every stored format side by side: format 2, format 3
    with bodies of every element-prefix width and some of 16 KiB or more, a format-3 value whose
    element prefix is damaged (that record counts 0), a damaged header (its value counts 0), skeletons and
    an even skeleton, and a gap (an offset not stored counts 0)."""
    store = MemoryStore()
    widths = [b"x" * n for n in (0, 1, 127, 128, 129, 5000, 16383, 16384, 40_000)]
    batch = store.batch()
    batch.put(Column.RECORDS, *record_log.encode(4, 0, 0, [
        records.frame(records.record_key(4, 0, o), 7, b"f2-%d" % o) for o in range(6)]))  # format 2: 0-5
    record_log.append(batch, 4, 0, 6, 8, widths * 3)  # format 3: 6-32
    record_log.append(batch, 4, 0, 33, 9, [b"y" * (i % 300) for i in range(CAP + 40)])  # two values
    first = 33 + CAP + 40
    skeletons = store.batch()
    record_log.append(store.batch(), 4, 0, first, 10, [b"z" * (i * 3) for i in range(50)], skeletons)  # no values
    store.write(batch)
    store.write(skeletons)  # format 4 (a `memory` topic's): the values' sizes without their bodies
    batch = store.batch()
    record_log.put_even_skeleton(batch, 4, 0, first + 60, 9, 1000, 11)  # 60 lost at the gap: 50 .. 59 unstored
    store.write(batch)
    end = first + 69
    broken = 33 + CAP + 5  # in a value of small bodies only (one of 16 KiB or more is counted record by record)
    key, value = next(iter(store.scan(Column.RECORDS, records.record_key(4, 0, broken), records.record_key(4, 0, end))))
    at, _ = frame_span(value, broken - (33 + CAP))
    damaged = store.batch()  # that record's element no longer starts with its field tag
    damaged.put(Column.RECORDS, key, value[:at] + b"\x12" + value[at + 1:])
    store.write(damaged)
    damage_table(store, 4, 0, 40)  # the first value of 33-...: every offset counts 0
    sized = dict(record_log.sizes(store, 4, 0, 0, end, fill=True))
    assert sized[broken] == 0 and sized[broken + 1] == (broken + 1 - 33) % 300
    assert sized[13] == 16384 and sized[40] == 0 and sized[first + 55] == 0
    assert sized[first + 2] == 6 and sized[first + 60] == 112

    def reference_cut(lo: int, hi: int, excess: int) -> tuple[int, int]:
        if excess <= 0 or hi <= lo:
            return lo, max(excess, 0)
        for offset in range(lo, hi):
            excess -= sized[offset]
            if excess <= 0:
                return offset + 1, 0
        return hi, excess

    bounds = [0, 1, 5, 6, 7, 13, 14, 32, 33, 34, 40, 33 + CAP, broken, broken + 1, first - 1, first, first + 49,
              first + 50, first + 60, first + 63, end - 1, end]
    for lo in bounds:
        for hi in bounds:
            if hi < lo:
                continue
            expected = sum(sized[o] for o in range(lo, hi))
            assert record_log.bytes_in(store, 4, 0, lo, hi) == expected, (lo, hi)
            for excess in (-1, 0, 1, expected // 3, expected - 1, expected, expected + 1, 10 ** 9):
                assert record_log.cut_for_bytes(store, 4, 0, lo, hi, excess) == reference_cut(lo, hi, excess), \
                    (lo, hi, excess)
