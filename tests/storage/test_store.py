"""One conformance suite for every Store implementation."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.storage import Column, Store
from broker.storage.memory import MemoryStore
from broker.storage.rocks import RocksStore, accepts_direct_io

pytestmark = pytest.mark.unit


@pytest.fixture(params=["rocks", "rocks-buffered", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = (RocksStore(tmp_path / "db") if request.param == "rocks"
                else RocksStore(tmp_path / "db", direct_writes=False) if request.param == "rocks-buffered"
                else MemoryStore())
    yield s
    s.close()


def k(i: int) -> bytes:
    return struct.pack(">IIQ", 1, 0, i)


def fill(store: Store, n: int) -> None:
    batch = store.batch()
    for i in range(n):
        batch.put(Column.RECORDS, k(i), b"v%d" % i)
    store.write(batch)


def test_scan_returns_keys_in_range_in_order(store: Store) -> None:
    fill(store, 20)
    got = list(store.scan(Column.RECORDS, k(5), k(9)))
    assert got == [(k(i), b"v%d" % i) for i in range(5, 9)]
    assert len(list(store.scan(Column.RECORDS, k(0), k(20), limit=3))) == 3


def test_columns_are_separate(store: Store) -> None:
    batch = store.batch()
    batch.put(Column.META, b"a", b"1")
    store.write(batch)
    assert store.get(Column.META, b"a") == b"1"
    assert store.get(Column.RECORDS, b"a") is None


def test_batch_is_invisible_until_written(store: Store) -> None:
    batch = store.batch()
    batch.put(Column.META, b"x", b"1")
    assert store.get(Column.META, b"x") is None
    store.write(batch, sync=True)
    assert store.get(Column.META, b"x") == b"1"


def test_delete_and_delete_range(store: Store) -> None:
    fill(store, 10)
    batch = store.batch()
    batch.delete(Column.RECORDS, k(9))
    batch.delete_range(Column.RECORDS, k(0), k(4))
    store.write(batch)
    assert [key for key, _ in store.scan(Column.RECORDS, k(0), k(100))] == [k(i) for i in range(4, 9)]


def test_checkpoint_and_replace_restore_exact_content(store: Store, tmp_path: Path) -> None:
    fill(store, 10)
    store.checkpoint(str(tmp_path / "cp"))
    batch = store.batch()
    batch.delete_range(Column.RECORDS, k(0), k(10))
    batch.put(Column.META, b"later", b"1")
    store.write(batch)
    store.replace_with(str(tmp_path / "cp"))
    assert len(list(store.scan(Column.RECORDS, k(0), k(100)))) == 10
    assert store.get(Column.META, b"later") is None


def test_rocks_store_reopens_with_restored_generation(tmp_path: Path) -> None:
    s = RocksStore(tmp_path / "db")
    fill(s, 3)
    s.checkpoint(str(tmp_path / "cp"))
    fill(s, 6)
    s.replace_with(str(tmp_path / "cp"))
    s.close()
    reopened = RocksStore(tmp_path / "db")
    assert len(list(reopened.scan(Column.RECORDS, k(0), k(100)))) == 3
    reopened.close()


def test_close_closes_a_replaced_generation_at_once(tmp_path: Path) -> None:
    """The generation a restore replaced is closed after a grace period, or by close() before that:
    no timer thread is left behind to call into RocksDB while the interpreter finalizes (this store's:
    a store an earlier test replaced may still be in its grace period)."""
    earlier = set(threading.enumerate())
    s = RocksStore(tmp_path / "db")
    fill(s, 3)
    s.checkpoint(str(tmp_path / "cp"))
    s.replace_with(str(tmp_path / "cp"))
    assert (tmp_path / "db" / "db-0").is_dir(), "the old generation stays open for readers a while"
    s.close()
    assert not (tmp_path / "db" / "db-0").exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("rocks-retire-") and t not in earlier]


def test_a_process_that_exits_right_after_a_restore_closes_the_old_generation_first(tmp_path: Path) -> None:
    """Without close(): the delayed close is not a daemon thread, so it runs before the interpreter
    finalizes (a daemon thread inside RocksDB's close at finalization aborts the process)."""
    program = textwrap.dedent(f"""
        from pathlib import Path
        from broker.storage import Column
        from broker.storage.rocks import RocksStore
        s = RocksStore(Path({str(tmp_path / "db")!r}))
        batch = s.batch()
        batch.put(Column.META, b"k", b"v")
        s.write(batch)
        s.checkpoint({str(tmp_path / "cp")!r})
        s.replace_with({str(tmp_path / "cp")!r})
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "db" / "db-0").exists(), "the old generation was closed and removed before exit"
    assert (tmp_path / "db" / "db-1").is_dir()


def test_get_many_returns_values_in_key_order(store: Store) -> None:
    fill(store, 3)
    assert store.get_many(Column.RECORDS, [k(2), k(7), k(0)]) == [b"v2", None, b"v0"]
    assert store.get_many(Column.RECORDS, []) == []


def _rocks_option(db_root: Path, name: str) -> str:
    """The value RocksDB recorded for option ``name`` in the newest OPTIONS file (one generation)."""
    [generation] = db_root.glob("db-*")
    newest = max(generation.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    values = {line.split("=", 1)[0].strip(): line.split("=", 1)[1].strip()
              for line in newest.read_text().splitlines() if "=" in line}
    return values[name]


@pytest.mark.parametrize("direct", [True, False])
def test_table_files_are_written_direct_unless_turned_off_and_hold_odd_sized_values(tmp_path: Path,
                                                                                    direct: bool) -> None:
    """``direct_writes`` reaches RocksDB (its OPTIONS file says so) where the file system takes O_DIRECT,
    and values of sizes that are no multiple of a block survive flushes and a reopen."""
    root = tmp_path / "db"
    sizes = [0, 1, 511, 4095, 4097, 65_537, 1_048_576 + 3]
    store = RocksStore(root, direct_writes=direct)
    try:
        assert store.direct_writes == (direct and accepts_direct_io(root))
        for round_ in range(5):  # five flushes: past RocksDB's trigger (4 files) for a compaction
            batch = store.batch()
            for i, size in enumerate(sizes):
                batch.put(Column.RECORDS, k(round_ * 100 + i), bytes([i + round_]) * size)
            store.write(batch)
            store.checkpoint(str(tmp_path / f"cp{round_}"))  # a checkpoint flushes the memtables
    finally:
        store.close()
    assert _rocks_option(root, "use_direct_io_for_flush_and_compaction") == str(store.direct_writes).lower()
    reopened = RocksStore(root, direct_writes=direct)
    try:
        for round_ in range(5):
            for i, size in enumerate(sizes):
                assert reopened.get(Column.RECORDS, k(round_ * 100 + i)) == bytes([i + round_]) * size
    finally:
        reopened.close()


def test_table_files_are_read_with_the_kernels_readahead(tmp_path: Path) -> None:
    """RocksDB opens table files without advising random access (its default), so reading a topic
    back from the disk gets the kernel's readahead (the store module's docstring)."""
    root = tmp_path / "db"
    store = RocksStore(root)
    try:
        fill(store, 3)
        store.checkpoint(str(tmp_path / "cp"))  # a flush: a table file to open
        assert store.get(Column.RECORDS, k(1)) == b"v1"
    finally:
        store.close()
    assert _rocks_option(root, "advise_random_on_open") == "false"


def _resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache (util-linux's ``fincore``)."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def _table_files(root: Path) -> list[Path]:
    return sorted(root.glob("db-*/*.sst"), key=lambda p: int(p.stem))


@pytest.mark.skipif(not Path("/usr/bin/fincore").exists(), reason="needs util-linux's fincore")
@pytest.mark.parametrize("drop_behind", [True, False])
def test_a_table_file_a_reader_has_passed_leaves_the_page_cache(tmp_path: Path, drop_behind: bool) -> None:
    """``release_pages`` drops from the page cache exactly the table files whose keys all lie in the
    range a reader has passed (one file per flush here), once; with ``drop_behind`` off, none; reads
    return the same either way."""
    root = tmp_path / "db"
    store = RocksStore(root, drop_behind=drop_behind)
    try:
        for first in (0, 100, 200):  # three flushes: keys 0-99, 100-199, 200-299
            batch = store.batch()
            for i in range(first, first + 100):
                batch.put(Column.RECORDS, k(i), bytes([i % 251]) * 4096)
            store.write(batch)
            store.checkpoint(str(tmp_path / f"cp-{first}"))  # flushes the memtable
        records = [f for f in _table_files(root) if f.stat().st_size > 300_000]
        assert len(records) == 3, _table_files(root)
        for f in records:  # into the page cache (the files were written past it)
            f.read_bytes()
            assert _resident_bytes(f) > 0
        store.release_pages(Column.RECORDS, k(0), k(150))  # 0-149 read: only the first file is passed
        passed = [_resident_bytes(f) == 0 for f in records]
        assert passed == ([True, False, False] if drop_behind else [False, False, False])
        records[0].read_bytes()
        store.release_pages(Column.RECORDS, k(0), k(150))  # each file is dropped once
        assert _resident_bytes(records[0]) > 0
        store.release_pages(Column.RECORDS, k(0), k(300))
        assert [_resident_bytes(f) == 0 for f in records] == [False, True, True] if drop_behind else [False] * 3
        assert [v for _, v in store.scan(Column.RECORDS, k(0), k(300))] == [bytes([i % 251]) * 4096 for i in range(300)]
    finally:
        store.close()


def test_release_pages_is_a_hint_every_store_takes(store: Store) -> None:
    """Every store takes the hint, whatever the range (empty, reversed, unknown keys), and reads the same after it."""
    fill(store, 5)
    for low, high in ((k(0), k(3)), (k(3), k(3)), (k(4), k(1)), (b"", b"\xff" * 20)):
        store.release_pages(Column.RECORDS, low, high)
    assert [v for _, v in store.scan(Column.RECORDS, k(0), k(9))] == [b"v%d" % i for i in range(5)]


def test_table_files_are_compressed_only_as_configured_and_read_back_under_any_setting(tmp_path: Path) -> None:
    """``compression`` reaches RocksDB (its OPTIONS file says so; the default is none), compressible
    records take far less disk with lz4 or zstd, and a store reopened with another setting reads the
    files written in the earlier one."""
    documents = {k(i): b'{"user": "user-%d", "action": "login", "ok": true}' % (i % 7) * 20 for i in range(2000)}
    names = {"none": "kNoCompression", "lz4": "kLZ4Compression", "zstd": "kZSTD", "snappy": "kSnappyCompression"}
    sizes = {}
    for compression in ("none", "lz4", "zstd", "snappy"):
        root = tmp_path / compression
        store = RocksStore(root) if compression == "none" else RocksStore(root, compression=compression)
        try:
            batch = store.batch()
            for key, value in documents.items():
                batch.put(Column.RECORDS, key, value)
            store.write(batch)
            store.checkpoint(str(tmp_path / f"cp-{compression}"))  # a checkpoint flushes the memtables
        finally:
            store.close()
        assert _rocks_option(root, "compression") == names[compression]
        sizes[compression] = sum(p.stat().st_size for p in root.rglob("*.sst"))
        reopened = RocksStore(root, compression="zstd" if compression == "none" else "none")
        try:
            assert all(reopened.get(Column.RECORDS, key) == value for key, value in documents.items())
        finally:
            reopened.close()
    assert sizes["none"] > sum(map(len, documents.values()))
    assert sizes["lz4"] * 5 < sizes["none"] and sizes["zstd"] * 5 < sizes["none"], sizes
    with pytest.raises(ValueError, match="none, lz4, snappy, zstd"):
        RocksStore(tmp_path / "bad", compression="gzip")
