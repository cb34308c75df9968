"""Writes without RocksDB's write-ahead log (``Store.write(wal=False)``, the state machine's applies
on a node: the Raft journal is their WAL): gone after a process crash unless flushed, kept by every
checkpoint (it flushes first), and never a mix of column families after a crash."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from broker.storage import Column
from broker.storage.rocks import WRITE_BUFFER_BYTES, RocksStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

_WRITER = textwrap.dedent("""
    import os, sys
    from broker.storage import Column
    from broker.storage.rocks import RocksStore
    store = RocksStore(sys.argv[1])
    wal = sys.argv[2] == "wal"
    record = int(sys.argv[5])
    for i in range(int(sys.argv[3])):
        batch = store.batch()
        batch.put(Column.RECORDS, i.to_bytes(8, "big"), b"x" * record)
        # about what an apply writes to META: the applied index, its digest, the partition's counters
        batch.put(Column.META, b"applied", i.to_bytes(8, "big"))
        batch.put(Column.META, b"digest", i.to_bytes(8, "big"))
        batch.put(Column.META, b"counters", i.to_bytes(8, "big") * 4)
        store.write(batch, wal=wal)
    if sys.argv[4] == "checkpoint":
        store.checkpoint(sys.argv[1] + "-checkpoint")
    if sys.argv[4] == "flush":
        store.flush()
    os._exit(9)  # a process crash: no close, no flush
""")


def _crash_after_writes(path: Path, wal: bool, count: int, checkpoint: bool, record_bytes: int = 1000, *,
                        flush: bool = False) -> None:
    then = "checkpoint" if checkpoint else "flush" if flush else "-"
    done = subprocess.run([sys.executable, "-c", _WRITER, str(path), "wal" if wal else "no-wal", str(count),
                           then, str(record_bytes)],
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 9, done.stderr


def _content(store: RocksStore) -> tuple[int, int | None]:
    records = len(list(store.scan(Column.RECORDS, b"", b"\xff" * 8)))
    applied = store.get(Column.META, b"applied")
    return records, None if applied is None else int.from_bytes(applied, "big")


def test_a_crash_keeps_writes_with_the_wal_and_drops_unflushed_writes_without_it(tmp_path: Path) -> None:
    _crash_after_writes(tmp_path / "wal", wal=True, count=200, checkpoint=False)
    _crash_after_writes(tmp_path / "nowal", wal=False, count=200, checkpoint=False)
    with_wal, without_wal = RocksStore(tmp_path / "wal"), RocksStore(tmp_path / "nowal")
    try:
        assert _content(with_wal) == (200, 199)
        assert _content(without_wal) == (0, None), "wal=False must skip the write-ahead log"
    finally:
        with_wal.close()
        without_wal.close()


def test_a_checkpoint_flushes_writes_made_without_the_wal_first(tmp_path: Path) -> None:
    _crash_after_writes(tmp_path / "s", wal=False, count=200, checkpoint=True)
    live = RocksStore(tmp_path / "s")
    restored = RocksStore(tmp_path / "restored")
    try:
        restored.replace_with(str(tmp_path / "s-checkpoint"))
        assert _content(restored) == (200, 199), "the checkpoint holds every write"
        assert _content(live) == (200, 199), "the flush before the checkpoint made the live store durable"
    finally:
        live.close()
        restored.close()


def test_after_a_crash_every_column_family_is_at_the_same_write(tmp_path: Path) -> None:
    """Enough writes without the WAL to fill memtables several times, then a crash: the records
    present are exactly those up to the applied index in META (atomic flush), whatever was lost."""
    _crash_after_writes(tmp_path / "s", wal=False, count=150_000, checkpoint=False)
    store = RocksStore(tmp_path / "s")
    try:
        records, applied = _content(store)
        assert applied is not None and records == applied + 1, (records, applied)
    finally:
        store.close()


def test_small_writes_flush_every_few_thousand_so_a_crash_loses_a_bounded_tail(tmp_path: Path) -> None:
    """Writes as small as the applies of one-record publishes fill no 64 MiB memtable for a long
    time, and without the WAL a crash lost all of them: a restarted node re-applied that whole tail
    of the journal before it served again. META's small memtable (``META_WRITE_BUFFER_BYTES``)
    fills after a few thousand writes and its flush takes every column family along."""
    count = 40_000
    _crash_after_writes(tmp_path / "s", wal=False, count=count, checkpoint=False, record_bytes=10)
    store = RocksStore(tmp_path / "s")
    try:
        records, applied = _content(store)
        assert applied is not None, "no flush in 40,000 small writes"
        assert records == applied + 1, (records, applied)
        assert count - (applied + 1) < 16_000, f"{count - applied - 1} writes lost"
    finally:
        store.close()


def test_a_close_flushes_writes_made_without_the_wal(tmp_path: Path) -> None:
    """A graceful stop keeps them (RocksDB flushes unpersisted memtables on close), so a restart after
    one replays nothing from the Raft journal."""
    store = RocksStore(tmp_path / "db")
    for i in range(200):
        batch = store.batch()
        batch.put(Column.RECORDS, i.to_bytes(8, "big"), b"x" * 1000)
        batch.put(Column.META, b"applied", i.to_bytes(8, "big"))
        store.write(batch, wal=False)
    store.close()
    reopened = RocksStore(tmp_path / "db")
    try:
        assert _content(reopened) == (200, 199)
    finally:
        reopened.close()


_COLUMN_WRITER = textwrap.dedent("""
    import os, sys
    from broker.storage import Column
    from broker.storage.rocks import RocksStore
    store = RocksStore(sys.argv[1])
    column, count, size = Column(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    for i in range(count):
        batch = store.batch()
        batch.put(column, i.to_bytes(8, "big"), i.to_bytes(8, "big") * (size // 8))
        store.write(batch, wal=False)
    os._exit(9)  # a process crash: no close, no flush
""")


@pytest.mark.parametrize("column", [Column.RECORDS, Column.DEDUP, Column.GROUPS])
def test_what_a_column_family_holds_unflushed_is_bounded(tmp_path: Path, column: Column) -> None:
    """Large writes to one column family, none to META, then a crash: at most two of its memtables
    (``WRITE_BUFFER_BYTES``: the one being filled and one being flushed) were lost. That bound is
    also what a log compaction's checkpoint must flush while it holds the replication thread: with
    RocksDB's default 64 MiB memtables these 48 MiB were all lost."""
    count, size = 48 * 1024, 1024
    done = subprocess.run([sys.executable, "-c", _COLUMN_WRITER, str(tmp_path / "s"), column.value, str(count),
                           str(size)], capture_output=True, text=True, timeout=100)
    assert done.returncode == 9, done.stderr
    store = RocksStore(tmp_path / "s")
    try:
        kept = len(list(store.scan(column, b"", b"\xff" * 8)))
    finally:
        store.close()
    lost_bytes = (count - kept) * size
    assert lost_bytes <= 2 * WRITE_BUFFER_BYTES, f"{count - kept} writes ({lost_bytes >> 20} MiB) were not flushed"


def test_a_flush_keeps_every_column_of_writes_without_the_wal_through_a_crash(tmp_path: Path) -> None:
    """``Store.flush`` (the state machine's at the rise to command format 5: no replay may cross it)."""
    _crash_after_writes(tmp_path / "flushed", wal=False, count=200, checkpoint=False, flush=True)
    store = RocksStore(tmp_path / "flushed")
    try:
        assert _content(store) == (200, 199)
        assert not (tmp_path / "flushed" / "flush-checkpoint").exists(), "the flush leaves nothing behind"
    finally:
        store.close()
