"""RocksDB store through rocksdict (the only module that imports rocksdict).

The live database is ``<root>/db-<generation>``; ``<root>/CURRENT`` names the generation.
:meth:`RocksStore.replace_with` opens a restored checkpoint as the next generation, switches to it
atomically and closes the previous one a little later, so readers iterating the old generation
are never pulled out from under (they finish on a consistent, slightly older view).

RocksDB writes its table files (memtable flushes and compactions) with ``O_DIRECT`` unless
``direct_writes`` is off or the file system refuses it (older tmpfs): reads still go through the page
cache. The page cache was otherwise filled with every record once more (the Raft journal holds it
too) at the rate of the publishes, and on a host where a fresh page is dear that cost more than the
write: 3 nodes on one VM whose guest hands freed memory back to its host (a fresh 4 KiB page then
costs 12-60 us to touch) published 1 KiB records at 31-46k msg/s once the page cache outgrew the
memory the guest still held, against 80-87k with direct writes, with every repetition alike. The
price is that a reader of records already flushed reads them from the disk: reading a just-published
topic back fell by about 30 % (bench/NOTE.md, 2026-12-04 22:40-23:20 UTC). Those reads go one
block after the next (a stored value of up to 256 KiB is one block), so the table files are opened
without RocksDB's default advice of random access, which turns the kernel's readahead off: a
consumer reading 1 KiB records back from the disk took 432-454k msg/s with readahead against
305k without (bench/NOTE.md, 2026-12-05, 11:55-12:50 UTC). Point reads (dedup keys) mostly end at a
table's bloom filter and the index, which the block cache holds.

Such a reader's table files stay in the page cache after it has passed them, 1 GB per 1M records of
1 KiB, and on the host above the page cache then grows into fresh memory: reading a just-published
topic back, the second and third such read in a cluster's life took 215-255k msg/s against 418-454k
for the first, the node's system time 2.0-2.6 s against 0.5-0.7 s per 1M records (bench/NOTE.md,
2026-12-05 21:10-22:00 UTC). With ``drop_behind`` (the default) the store drops a table file from
the page cache once a reader has read past every key in it (:meth:`RocksStore.release_pages`,
``posix_fadvise(DONTNEED)``), so the pages a read frees serve the next one: 436-501k msg/s each
time. A second reader of the same records reads them from the disk again, which is why it can be
turned off (``store_drop_behind``).

Table files are not compressed unless ``compression`` says so (``store_compression``). RocksDB's
default, snappy, tried every block of every flush and compaction: at 1 KiB publishes of payloads
that do not compress (random, encrypted or already compressed), the attempt and its copies cost the
nodes ~0.4 us of CPU per record, 3 % of it, for nothing (bench/NOTE.md, 2026-12-05 09:05 UTC),
and records are often stored compressed by their producers already. Kafka's brokers keep what
producers send, and NATS JetStream streams are not compressed, unless configured. Topics of
compressible records (JSON, logs) save disk with ``lz4`` (fast) or ``zstd`` (smallest): 2,000
small JSON documents took 2.2 MB of table files uncompressed, 77 KB with lz4, 68 KB with zstd.
RocksDB reads any table file in the compression it was written with, so the setting can change
between restarts; compactions rewrite older files in the new one.

That later close runs on a timer thread that is not a daemon, and :meth:`RocksStore.close` does
every close still pending itself. A daemon thread must never be inside rocksdict when the
interpreter finalizes: rocksdict releases the GIL while RocksDB closes, and a daemon thread that
takes the GIL back during finalization is ended by ``pthread_exit``. That unwinds through Rust
frames and aborts the whole process (SIGABRT; seen as the test runner dying after its last test).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from pathlib import Path

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Checkpoint,
    ColumnFamily,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from broker.storage import Batch, Column, StorageFailure, StoreCorruption

logger = logging.getLogger(__name__)

_Handles = tuple[Rdict, dict[Column, Rdict], dict[Column, ColumnFamily]]

_OLD_DB_GRACE_S = 5.0
_RECOVERY_HINT = ("stop the node and move the store directory {root} away: the node rebuilds it from its Raft "
                  "snapshot and journal (or from the leader) at the next start; if the damaged file is a table "
                  "file (.sst), move the node's whole data directory away instead, so that the leader catches "
                  "it up (its last snapshot shares the store's table files)")


def _is_damage(exc: Exception) -> bool:
    """rocksdict raises plain ``Exception`` with RocksDB's status text (e.g. 'Corruption: block checksum
    mismatch ... in <file> offset N size M')."""
    text = str(exc)
    return text.startswith(("Corruption:", "IO error:")) or "Corruption" in text.split(":", 1)[0]


# META's memtable. Applies run without RocksDB's WAL (the Raft journal is the WAL), so a node that
# crashes re-applies every command since the store's last flush when it restarts, and it answers
# "no leader known" until it has. With RocksDB's default 64 MiB memtables, and commands of a few
# small records, the store flushed only at each log compaction (every 20,000 commands): a follower
# killed under load then took up to 11 s to serve again (the 20-leader-kill tests). META's
# memtable grows ~130 bytes per applied command (applied index, digest, counters), so 512 KiB
# fills after ~4,000 of them, and its flush takes every column family along (atomic flush).
# Large commands fill the records' memtable first (WRITE_BUFFER_BYTES).
META_WRITE_BUFFER_BYTES = 512 * 1024
# Every other column family's memtable (RocksDB's default is 64 MiB). A log compaction's checkpoint
# flushes the memtables while it holds the replication thread (and the GIL), and that stall grows
# with what they hold: 1 KiB publishes filled the records' memtable before META's, and the leader's
# checkpoint took up to 578 ms against a 0.4 s election timeout. With 16 MiB
# the checkpoints flush about a third as much (bench/NOTE.md, 2026-12-03 14:25). It also bounds
# what a crash makes a node re-apply: at most two memtables per column family are unflushed.
WRITE_BUFFER_BYTES = 16 * 1024 * 1024


COMPRESSIONS = ("none", "lz4", "snappy", "zstd")  # of the table files (the module docstring says why none)
_COMPRESSION_TYPES = {"none": DBCompressionType.none, "lz4": DBCompressionType.lz4,
                      "snappy": DBCompressionType.snappy, "zstd": DBCompressionType.zstd}


def _options(point_lookups: bool = False, write_buffer_bytes: int | None = None,
             direct_writes: bool = False, compression: str = "none") -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_compression_type(_COMPRESSION_TYPES[compression]())
    if direct_writes:  # table files written past the page cache (the module docstring says why)
        opts.set_use_direct_io_for_flush_and_compaction(True)
    # the kernel's readahead on table files (RocksDB's default advises random access, which turns it
    # off): a reader going through a topic asks for one block after the next (the module docstring)
    opts.set_advise_random_on_open(False)
    # column families flush together, so no crash can leave one ahead of another (e.g. the
    # applied index in META ahead of the records it covers); a flush that one memtable triggers
    # flushes every column family that holds writes
    opts.set_atomic_flush(True)
    if write_buffer_bytes is not None:
        opts.set_write_buffer_size(write_buffer_bytes)
    if point_lookups:  # dedup keys: mostly lookups of keys that are not there
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        opts.set_memtable_prefix_bloom_ratio(0.1)
        opts.set_memtable_whole_key_filtering(True)
    return opts


DROP_BEHIND_LIST_EVERY_S = 1.0  # how stale the list of table files a drop-behind reads may be


def _drop_cached(path: str) -> None:
    """Advise the kernel to drop ``path``'s pages from the page cache (a file gone meanwhile: nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


class _DropBehind:
    """The table files of one database that readers have passed, dropped from the page cache once.

    ``live_files`` (RocksDB's list of table files: name, first and last key, of every column family,
    which it does not name) is read at most every :data:`DROP_BEHIND_LIST_EVERY_S`; a file flushed
    since holds keys a reader reaches later, so a stale list only delays its drop. Files are kept
    sorted by first key and each is dropped at most once, so a call is two bisections unless it
    drops something. Thread-safe (readers on several threads share the store)."""

    def __init__(self, live_files: Callable[[], list[dict[str, object]]], directory: Path) -> None:
        self._live_files = live_files
        self._directory = str(directory)
        self._lock = threading.Lock()
        self._listed_at = float("-inf")
        self._files: list[tuple[bytes, bytes, str]] = []  # (first key, last key, name), by first key
        self._firsts: list[bytes] = []
        self._dropped: set[str] = set()

    def passed(self, low: bytes, high: bytes) -> None:
        """Every key in ``[low, high)`` has been read: drop the files whose keys all lie there."""
        now = time.monotonic()
        with self._lock:
            if now - self._listed_at >= DROP_BEHIND_LIST_EVERY_S:
                self._list(now)
            lo, hi = bisect_left(self._firsts, low), bisect_left(self._firsts, high)
            passed = [f for f in self._files[lo:hi] if f[1] < high]
            if not passed:
                return
            self._dropped.update(name for _, _, name in passed)
            self._keep([f for f in self._files if f[2] not in self._dropped])
        for _, _, name in passed:
            _drop_cached(self._directory + name)

    def _list(self, now: float) -> None:
        self._listed_at = now
        try:
            live = self._live_files()
        except Exception:  # noqa: BLE001 (a database closed meanwhile: nothing to drop)
            return
        files: list[tuple[bytes, bytes, str]] = []
        for f in live:
            first, last, name = f.get("start_key"), f.get("end_key"), f.get("name")
            if isinstance(first, bytes) and isinstance(last, bytes) and isinstance(name, str):
                files.append((first, last, name))
        files.sort()
        names = {name for _, _, name in files}
        self._dropped &= names  # compacted away: forgotten
        self._keep([f for f in files if f[2] not in self._dropped])

    def _keep(self, files: list[tuple[bytes, bytes, str]]) -> None:
        self._files = files
        self._firsts = [first for first, _, _ in files]


def _no_wal() -> WriteOptions:
    options = WriteOptions()
    options.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; the stub says method
    return options


def _shutdown_flush_failure(db: Rdict, cfs: dict[Column, Rdict]) -> Exception | None:
    """After ``cancel_all_background``: why RocksDB's shutdown flush left writes in the memtables, or
    None. RocksDB swallows that flush's error; a failed flush leaves a background error, which an
    empty write reports (it writes nothing)."""
    if not any((cf.property_int_value("rocksdb.num-entries-active-mem-table") or 0)
               + (cf.property_int_value("rocksdb.num-entries-imm-mem-tables") or 0) for cf in cfs.values()):
        return None
    try:
        db.write(WriteBatch(raw_mode=True), _no_wal())
    except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
        return exc
    return None


class RocksBatch:
    """A rocksdict WriteBatch addressed by :class:`Column`."""

    def __init__(self, handles: dict[Column, ColumnFamily]) -> None:
        self._wb = WriteBatch(raw_mode=True)
        self._handles = handles

    @property
    def write_batch(self) -> WriteBatch:
        return self._wb

    def put(self, column: Column, key: bytes, value: bytes) -> None:
        self._wb.put(key, value, self._handles[column])

    def delete(self, column: Column, key: bytes) -> None:
        self._wb.delete(key, self._handles[column])

    def delete_range(self, column: Column, begin: bytes, end: bytes) -> None:
        self._wb.delete_range(begin, end, self._handles[column])


def accepts_direct_io(directory: Path) -> bool:
    """Whether files in ``directory`` can be opened with ``O_DIRECT`` (older tmpfs and some network
    file systems refuse it)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = directory / ".direct-io-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink(missing_ok=True)
    return True


class RocksStore:
    """A :class:`broker.storage.Store` on RocksDB.

    ``direct_writes``: write table files with ``O_DIRECT`` where the file system allows it (the
    module docstring says why); :attr:`direct_writes` tells whether it is in effect.
    ``compression``: of the table files, one of :data:`COMPRESSIONS`. ``drop_behind``: drop a table
    file from the page cache once a reader has passed it (:meth:`release_pages`)."""

    def __init__(self, root: Path, *, direct_writes: bool = True, compression: str = "none",
                 drop_behind: bool = True) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"store compression must be one of {', '.join(COMPRESSIONS)}, not {compression!r}")
        self.compression = compression
        self.drop_behind = drop_behind
        self._root = Path(root)
        self._root.mkdir(parents=True, exist_ok=True)
        self.direct_writes = direct_writes and accepts_direct_io(self._root)
        if direct_writes and not self.direct_writes:
            logger.info("store %s: table files are written through the page cache (O_DIRECT refused)", self._root)
        self._lock = threading.Lock()
        # generations replaced but not closed yet: their timer, their handles, their directory
        self._retiring: dict[int, tuple[threading.Timer, _Handles, Path]] = {}
        self._generation = self._read_generation()
        db_path = self._db_path(self._generation)
        try:
            self._db, self._cfs, self._handles = self._open(db_path)
            self._passed = self._drop_behind(self._db, db_path)
        except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
            if not _is_damage(exc):
                raise
            raise StoreCorruption(f"the store {db_path} cannot be opened ({exc}); "
                                  f"{_RECOVERY_HINT.format(root=self._root)}") from None
        self._sync_opts = WriteOptions()
        self._sync_opts.sync = True
        self._no_wal_opts = WriteOptions()
        self._no_wal_opts.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; the stub says method

    # -- lifecycle ---------------------------------------------------------------------------
    def _db_path(self, generation: int) -> Path:
        return self._root / f"db-{generation}"

    def _read_generation(self) -> int:
        current = self._root / "CURRENT"
        if not current.exists():
            return 0
        text = current.read_bytes()[:64]
        try:
            generation = int(text.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            generation = -1
        present = sorted(p.name for p in self._root.glob("db-*"))
        if generation < 0 or not self._db_path(generation).is_dir():
            raise StoreCorruption(
                f"{current} is damaged: it holds {text!r}, which does not name a database directory "
                f"(present: {', '.join(present) or 'none'}); {_RECOVERY_HINT.format(root=self._root)}")
        return generation

    def _write_generation(self, generation: int) -> None:
        tmp = self._root / "CURRENT.tmp"
        tmp.write_text(str(generation))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self._root / "CURRENT")

    def _drop_behind(self, db: Rdict, path: Path) -> _DropBehind | None:
        return _DropBehind(db.live_files, path) if self.drop_behind else None

    def _open(self, path: Path) -> _Handles:
        direct, compression = self.direct_writes, self.compression
        column_families = {c.value: _options(point_lookups=c == Column.DEDUP, direct_writes=direct,
                                             write_buffer_bytes=META_WRITE_BUFFER_BYTES if c == Column.META
                                             else WRITE_BUFFER_BYTES, compression=compression)
                           for c in Column}
        db = Rdict(str(path), options=_options(direct_writes=direct, compression=compression),
                   column_families=column_families,
                   access_type=AccessType.read_write())
        cfs = {c: db.get_column_family(c.value) for c in Column}
        handles = {c: db.get_column_family_handle(c.value) for c in Column}
        return db, cfs, handles

    def close(self) -> None:
        """Close the database and every replaced generation whose delayed close is still pending."""
        with self._lock:
            retiring = list(self._retiring.values())
            self._retiring.clear()
            for timer, old, path in retiring:
                timer.cancel()
                self._release(*old, path)
                shutil.rmtree(path, ignore_errors=True)
            self._release(self._db, self._cfs, self._handles, self._db_path(self._generation))
        for timer, _, _ in retiring:  # cancelled: each ends at once (joined outside the lock _retire takes)
            timer.join()

    @staticmethod
    def _release(db: Rdict, cfs: dict[Column, Rdict], handles: dict[Column, ColumnFamily], path: Path) -> None:
        """Close the database; the column-family objects share it, so drop them too (else the LOCK stays).

        Every column family's memtable is flushed in ONE atomic flush, RocksDB's own at shutdown
        (``cancel_all_background``, with ``atomic_flush`` set), which also refuses every flush after
        it. Closing a column-family object flushes that column family alone (rocksdict), so closing
        them one by one on a full disk flushed META (small) and then failed on RECORDS: the store
        came back with META's applied index, counters and digest ahead of the records and dedup
        state they cover, and the journal's replay started past the commands whose records were
        lost (a follower stopped on a full disk lost 9,800 records and diverged). A flush that fails
        (a full disk) is logged, not raised, and the rest is still closed: a node stopping on a full
        disk exits cleanly instead of with a traceback, and what was not flushed is applied again
        from the Raft journal at the next start (applies skip RocksDB's WAL because the journal
        holds them, docs/design/log.md)."""
        failure: Exception | None = None
        try:
            # RocksDB flushes at shutdown only after a write that skipped the WAL; an empty one (it
            # writes nothing) says so, so that what WAL writes left in the memtables is flushed too
            db.write(WriteBatch(raw_mode=True), _no_wal())
        except Exception as exc:  # noqa: BLE001 (a background error already: the shutdown flushes nothing)
            failure = exc
        try:
            db.cancel_all_background(True)  # whatever happened above: no flush of one column family after it
            failure = failure or _shutdown_flush_failure(db, cfs)
        except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
            failure = failure or exc
        for cf in [*cfs.values(), db]:
            try:
                cf.close()  # its own flush is refused now ("Shutdown in progress"): nothing left or torn
            except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
                if not str(exc).startswith("Shutdown in progress"):
                    failure = failure or exc
        cfs.clear()
        handles.clear()
        if failure is not None:
            logger.error("store %s: could not flush its memtables while closing (%s); what they held is applied "
                         "again from the Raft journal at the next start (free space on that disk first)", path, failure)

    # -- writes ------------------------------------------------------------------------------
    def batch(self) -> RocksBatch:
        return RocksBatch(self._handles)

    def write(self, batch: Batch, *, sync: bool = False, wal: bool = True) -> None:
        assert isinstance(batch, RocksBatch), "a batch from another store"
        assert wal or not sync, "a synced write goes through the write-ahead log"
        try:
            if sync:
                self._db.write(batch.write_batch, self._sync_opts)
            elif not wal:
                self._db.write(batch.write_batch, self._no_wal_opts)
            else:
                self._db.write(batch.write_batch)
        except Exception as exc:
            raise StorageFailure(f"write failed: {exc}") from exc

    # -- reads -------------------------------------------------------------------------------
    def get(self, column: Column, key: bytes) -> bytes | None:
        try:
            value: bytes | None = self._cfs[column].get(key)
        except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
            raise self._damage(column, exc) from exc
        return value

    def _damage(self, column: Column, exc: Exception) -> StorageFailure:
        """``exc`` as :class:`StoreCorruption` when it reports damage, else as :class:`StorageFailure`."""
        if not _is_damage(exc):
            return StorageFailure(f"column {column.value}: read failed: {exc}")
        return StoreCorruption(f"column {column.value} of {self._db_path(self._generation)}: {exc}")

    def get_many(self, column: Column, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        query: list[str | int | float | bytes | bool] = list(keys)
        try:
            values = self._cfs[column].get(query)  # rocksdict: a list of keys is one multi-get
        except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
            raise self._damage(column, exc) from exc
        assert isinstance(values, list) and len(values) == len(keys)
        return values

    def scan(self, column: Column, begin: bytes, end: bytes, limit: int | None = None) -> Iterator[
        tuple[bytes, bytes]
    ]:
        read_opts = ReadOptions()
        read_opts.set_iterate_upper_bound(end)
        try:
            it = self._cfs[column].iter(read_opts)
            it.seek(begin)
            valid = it.valid()
        except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
            raise self._damage(column, exc) from exc
        count = 0
        while valid and (limit is None or count < limit):
            yield it.key(), it.value()
            count += 1
            try:
                it.next()
                valid = it.valid()
            except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
                raise self._damage(column, exc) from exc
        if not valid:  # the end of the range, or a read error (RocksDB ends the iteration silently)
            try:
                it.status()
            except Exception as exc:  # noqa: BLE001 (rocksdict raises plain Exception)
                raise self._damage(column, exc) from exc

    def size_bytes(self) -> int:
        total = 0
        for cf in self._cfs.values():
            total += cf.property_int_value("rocksdb.total-sst-files-size") or 0
            total += cf.property_int_value("rocksdb.size-all-mem-tables") or 0
        return total

    def release_pages(self, column: Column, low: bytes, high: bytes) -> None:
        """A reader has read every key of ``column`` in ``[low, high)``: with ``drop_behind``, the
        table files whose keys all lie there leave the page cache (the module docstring says why).
        RocksDB's list of files does not say which column family each belongs to, so a small file of
        another column whose keys fall in the range may be dropped too: it is read from the disk (or
        RocksDB's block cache) again when next needed, nothing else."""
        passed = self._passed
        if passed is not None and low < high:
            passed.passed(low, high)

    # -- snapshots ---------------------------------------------------------------------------
    def checkpoint(self, directory: str) -> None:
        Checkpoint(self._db).create_checkpoint(directory)

    def flush(self) -> None:
        """Every column family's memtables to table files in one atomic flush: a checkpoint's (made
        and removed at once; its table files are hard links). rocksdict flushes one column family
        at a time, and a crash between two would leave one ahead of another."""
        directory = self._root / "flush-checkpoint"
        shutil.rmtree(directory, ignore_errors=True)
        try:
            Checkpoint(self._db).create_checkpoint(str(directory))
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def replace_with(self, directory: str) -> None:
        with self._lock:
            new_generation = self._generation + 1
            new_path = self._db_path(new_generation)
            if new_path.exists():
                shutil.rmtree(new_path)
            shutil.move(directory, new_path)
            db, cfs, handles = self._open(new_path)
            old = (self._db, self._cfs, self._handles)
            old_generation = self._generation
            self._db, self._cfs, self._handles = db, cfs, handles
            self._passed = self._drop_behind(db, new_path)
            self._generation = new_generation
            self._write_generation(new_generation)
            # not a daemon: the interpreter waits for it before it finalizes (module docstring)
            timer = threading.Timer(_OLD_DB_GRACE_S, self._retire, args=(old_generation,))
            timer.name = f"rocks-retire-{old_generation}"
            self._retiring[old_generation] = (timer, old, self._db_path(old_generation))
        timer.start()

    def clear(self) -> None:
        # an empty database as the next generation (CURRENT names it once it is open)
        empty = self._root / "clear.tmp"
        shutil.rmtree(empty, ignore_errors=True)
        empty.mkdir()
        self.replace_with(str(empty))

    def _retire(self, generation: int) -> None:
        """Close a replaced generation (unless :meth:`close` did already) and delete its directory."""
        with self._lock:  # held while closing, so that close() returns only after it
            entry = self._retiring.pop(generation, None)
            if entry is None:
                return
            _, old, path = entry
            self._release(*old, path)
            shutil.rmtree(path, ignore_errors=True)

