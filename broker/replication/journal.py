"""The Raft journal: a directory of append-only segment files of checksummed records, fsynced before
any Raft message reflecting them leaves the node (etcd's rule: persist entries and hard state, then
send).

pysyncobj keeps its log in a ``Journal`` (``pysyncobj.syncobj.createJournal`` builds it). Its stock
``FileJournal`` is an mmap that is never synced, with 4-byte offsets. :class:`DurableJournal` appends
every change to the last segment of its directory:

    <dir>/<sequence: 16 hex digits>.seg      sequences 1, 2, 3, ... with no gap
    header   magic(8) sequence(8) crc(4) | synced length(8) crc(4)   (32 bytes)
    record   length(4) crc(4) type(1) payload      crc covers type + payload

The checksum is CRC32C (magic ``RBJRNL02``; hardware-assisted through ``google_crc32c``, about 7x
cheaper per byte than zlib's CRC-32 here, and every entry is checksummed on every replica). A
segment of the first format (magic ``RBJRNL01``, zlib's CRC-32) is still read, and appended to in its
own checksum; the next segment is written in the current one.

Records: ENTRY (index, term, command), TRUNCATE (drop the held entries with index >= i), TERM (term,
voted-for), COMMIT (commit index), COMPACT (drop the held entries with index < i). Replaying the
segments in order rebuilds the state. Reading a segment stops at its first short or corrupt record,
so what is recovered is always a prefix of what was written; past the synced length recorded in its
header that is a torn tail and is cut off, before it it is damage and the journal refuses to open.

No record is ever changed (``docs/design/log-is-the-store.md`` builds on it): a segment is appended
to, sealed, and later deleted whole. (A direct write, below, writes the block that holds the end again,
with the same bytes.)
- **What is held in memory.** For every entry of the log: its index, its term, where its record
  is (segment, offset, command length) and its command's first byte (pysyncobj's command type, so a
  restart finds the membership changes without reading the commands back), 41 bytes in arrays. The
  commands themselves only for the
  newest entries, up to ``cache_bytes`` (and always the last one): what followers that keep up are
  sent and what the node applies next. An older entry is read back from its segment (one ``pread``
  per run of entries in one segment, every record's checksum checked again), for a follower that is
  behind or a restart's apply, so a long log costs disk, not memory. The first entry is kept too:
  pysyncobj reads it on every send.
- **Opening.** The last segment is read whole and every record checked. A sealed one was fsynced
  whole, so it holds no torn tail: its small records are read and checked, and of an entry of at
  least 64 KiB only the record's header, the entry's index and term and the command's first byte
  (``_scan_sealed``); its checksum is checked when it is read back, as every read back checks it.
  The sealed segments are scanned on up to 8 threads at once (on a cold page cache each scan waits
  on the disk read after read), then replayed in order. The last entry is read back at open, so a
  log whose last term is damaged is refused, never trusted in an election. A restart thus reads
  ~4 KiB per large entry instead of the whole log (up to 1.5 GiB on a leader).
- **Sealing.** Once the last segment holds ``segment_bytes``, the next entry goes to a new segment.
  The full one is fsynced and its header records its whole length. The new one is written under a
  temporary name with the state that is not an entry (TERM, COMMIT, and COMPACT up to the first
  entry held), fsynced and renamed in place. So a sealed segment matters only for its entries.
- **Log compaction** (``deleteEntriesTo``) fsyncs the snapshot that covers the dropped prefix
  (``snapshot_barrier``), appends COMPACT, and deletes the sealed segments whose every entry is now
  below the first one kept (once COMPACT is fsynced, on a thread of their own: an unlink of 64 MiB
  takes ~30 ms here). Most compactions delete nothing and write one small record: the whole
  file is no longer rewritten on the replication thread.
- **``clear``** (a snapshot installed) fsyncs the snapshot, starts a new segment whose COMPACT drops
  every entry, and deletes all the older segments.
- **Large records past the page cache.** A record of at least ``direct_write_min_bytes`` (64 KiB: a
  batch of 1,000 records of 100 B or more) is written with ``O_DIRECT``. The journal reads back little (the
  newest commands are in memory), so its pages in the page cache were only copies that pushed the
  store's pages out. On this VM (bench/NOTE.md, 2026-12-03 17:45 UTC) a buffered write costs 2-3 s
  of system CPU per GiB, because the kernel takes fresh pages that the host must fault in; a direct
  one 0.1-0.2 s, and it blocks the thread ~0.8 ms per MiB instead (1 KiB publishes +10-25 %).
  O_DIRECT needs aligned offsets, lengths and memory, so the block that holds the end of the segment
  is kept in memory (``_tail``) and written again whole, from an ``mmap`` buffer, followed by the
  record and zeros up to the next block. The next record overwrites those zeros; a replay stops at
  them as at any torn tail (cut quietly, at most one block); sealing and a clean close cut them off.
  Block 0 (the header, whose synced length the journal's own thread rewrites) is never written
  directly. Smaller records stay buffered: for them the device's round trip (~0.1 ms) costs more
  than the copy (at 100 B, batches of ~130 KB written direct measured no faster). A file system that
  refuses ``O_DIRECT`` gets buffered writes only (logged once). Durability is unchanged: what a sync
  must make durable is made durable by ``fdatasync``, whichever way it was written.
- **Upgrade.** The single-file journal of earlier releases (``legacy_file``, the same header and
  records) is renamed into the directory as segment 1 at the first open, and a short file with
  another magic (``LEGACY_MARKER``) takes its place: a node rolled back to an earlier release
  refuses it rather than start with no journal.

What is synced and when (see ``docs/design/replication.md``): TERM records always mark the journal
"sync pending"; ENTRY and TRUNCATE records do when ``needs_sync(command)`` says so (entries of the
``fsync`` durability class, membership changes) or when ``sync_entries`` is "all". The transport
(``SyncingTransport``) holds back every message while a sync is pending and fsyncs once before it
releases them (group commit); a node applies nothing that still needs a sync. A journal opened after
a crash is fsynced once, so whatever was recovered is durable from then on.

Power-loss simulation (tests): on open each segment is cut back to the synced length recorded in its
header, dropping every byte written but not fsynced.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
import threading
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
from pysyncobj.journal import Journal
from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from broker.replication import ReplicaDataDamaged
from broker.replication.stats import LatencyTally

logger = logging.getLogger(__name__)

MAGIC = b"RBJRNL02"  # what every new segment is written in: CRC32C checksums
MAGIC_ZLIB = b"RBJRNL01"  # the first format: zlib's CRC-32 (read, and appended to until sealed)
HEADER_BYTES = 32
SEGMENT_SUFFIX = ".seg"
JOURNAL_DIR_NAME = "journal"  # beside the single-file journal of earlier releases (raft.py's JOURNAL_FILE_NAME)
SEGMENT_BYTES_DEFAULT = 64 * 1024 * 1024
CACHE_BYTES_DEFAULT = 64 * 1024 * 1024  # the newest commands held in memory (the rest is read back)
# Records of at least this many bytes are written past the page cache (O_DIRECT): see the module docstring.
DIRECT_WRITE_MIN_BYTES_DEFAULT = 64 * 1024
_BLOCK = 4096  # O_DIRECT's alignment of offsets, lengths and memory (disks of 512 B and 4 KiB blocks; else EINVAL)
# A sealed segment's entries of at least this many bytes are not read at open (_scan_sealed): their
# checksum is checked when they are read back. The scan reads a block where a record starts, and
# _SCAN_CHUNK_BYTES (or the record) where a small record goes past what it has read.
_CHECK_LATER_MIN_BYTES = 64 * 1024
_SCAN_CHUNK_BYTES = 256 * 1024
_PEEK_BYTES = _BLOCK
_SCAN_THREADS = 8  # sealed segments scanned at once at open
_UNCHECKED = 0  # a scanned entry whose checksum is checked at read-back (not a record type)
_ONE_OFF_BUFFER_BYTES = 4 * 1024 * 1024  # a larger direct write gets a buffer of its own, unmapped after it
_NEW_SUFFIX = ".new"  # a segment being created: renamed into place once fsynced
# Left where the single-file journal of earlier releases was: they refuse it ("not a raftbroker
# journal", bad header) instead of starting with an empty journal, which could vote twice in a term.
LEGACY_MARKER = b"RBJSEGS1"
_HEAD = struct.Struct("<8sQI")  # magic, sequence (a generation in the single-file journal), crc of the first 16 bytes
_SIM = struct.Struct("<QI")  # synced length, crc of it (at offset _HEAD.size)
_REC = struct.Struct("<IIB")  # payload length (incl. type), crc(type + payload), type
_ENTRY = struct.Struct("<QQ")
_COMMAND_AT = _REC.size + _ENTRY.size  # an ENTRY record's command starts this far into the record
_COMMAND_IN_RECORD = 1 + _ENTRY.size  # ...and this far into what its CRC covers (type, index, term)
_U64 = struct.Struct("<Q")
ENTRY, TRUNCATE, TERM, COMMIT, COMPACT = 1, 2, 3, 4, 5
_EVERY_INDEX = (1 << 64) - 1  # COMPACT up to it: no entry is kept
_NO_VOTE = b"\x00"
_VOTE = b"\x01"

Entry = tuple[bytes, int, int]
Checksum = Callable[[bytes, int], int]  # (data, the checksum so far) -> the checksum extended by data


def _crc32c(data: bytes, start: int = 0) -> int:
    return int(google_crc32c.extend(start, data))


def _crc32(data: bytes, start: int = 0) -> int:
    return zlib.crc32(data, start)


CHECKSUMS: dict[bytes, Checksum] = {MAGIC: _crc32c, MAGIC_ZLIB: _crc32}
_datasync = getattr(os, "fdatasync", os.fsync)


class JournalError(ReplicaDataDamaged):
    """A journal that is not one of ours, or whose fsynced records are damaged or missing."""


def fsync_path(path: Path) -> None:
    """fsync a file or directory by path (missing files are ignored)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segment_name(sequence: int) -> str:
    return f"{sequence:016x}{SEGMENT_SUFFIX}"


def segment_sequences(directory: Path) -> list[int]:
    """The sequences of the segments in ``directory``, ascending (files of other names are ignored)."""
    found = []
    for path in directory.glob("*" + SEGMENT_SUFFIX):
        stem = path.name[:-len(SEGMENT_SUFFIX)]
        if len(stem) == 16 and all(c in "0123456789abcdef" for c in stem):
            found.append(int(stem, 16))
    return sorted(found)


def _record(crc: Checksum, kind: int, payload: bytes) -> bytes:
    return b"".join(_record_parts(crc, kind, payload))


def _record_parts(crc: Checksum, kind: int, payload: bytes, tail: bytes = b"") -> tuple[bytes, bytes]:
    """A record whose payload is ``payload + tail``, as (record head + ``payload``, ``tail``),
    without copying ``tail``: a command is written as it came (``os.pwritev``), its checksum
    computed over it in place."""
    check = crc(tail, crc(payload, crc(bytes((kind,)), 0)))
    return _REC.pack(1 + len(payload) + len(tail), check, kind) + payload, tail


def _header(sequence: int, synced_bytes: int) -> bytes:
    """The header of a new segment (always the current format)."""
    crc = CHECKSUMS[MAGIC]
    head = _HEAD.pack(MAGIC, sequence, 0)[:16]
    sim = _U64.pack(synced_bytes)
    out = head + struct.pack("<I", crc(head, 0)) + sim + struct.pack("<I", crc(sim, 0))
    assert len(out) == HEADER_BYTES
    return out


def _term_payload(term: int, voted_for: str | None) -> bytes:
    vote = _NO_VOTE if voted_for is None else _VOTE + voted_for.encode()
    return _U64.pack(term) + vote


@dataclass(slots=True)
class _Scan:
    """What a sealed segment's scan at open found (``DurableJournal._scan_sealed``)."""
    crc: Checksum
    size: int
    # (type, offset, record length, item): an entry's item is (index, term, command's first byte,
    # checksum to check at read-back if the type is _UNCHECKED); any other record's is its bytes
    found: list[tuple[int, int, int, Any]] = field(default_factory=list)
    good: int = 0  # the offset after the last good record
    read_bytes: int = 0
    unread_bytes: int = 0


@dataclass(slots=True)
class _Segment:
    sequence: int
    path: Path
    crc: Checksum = _crc32c  # its records' checksum (by its magic)
    max_index: int = 0  # the highest entry index written into it (0: none)
    reader: int = -1  # a read-only descriptor, opened at the first read back

    def close_reader(self) -> None:
        if self.reader >= 0:
            os.close(self.reader)
            self.reader = -1


class DurableJournal(Journal):
    """pysyncobj's ``Journal`` on append-only, checksummed, fsync-on-demand segment files.

    Only the replication thread calls it. ``needs_sync(command)`` classifies appended entries;
    ``sync_entries`` is "flagged" (ask ``needs_sync``), "all" or "never" (negative controls: only
    TERM records are synced). ``snapshot_barrier`` is called before a compaction or ``clear`` drops
    entries. ``legacy_file``: a single-file journal of an earlier release, adopted as segment 1.
    ``cache_bytes``: how many bytes of the newest commands stay in memory (the module docstring).
    """

    def __init__(self, directory: Path, *, needs_sync: Callable[[bytes], bool], sync_entries: str = "flagged",
                 snapshot_barrier: Callable[[], None] | None = None, simulate_power_loss: bool = False,
                 fsync_latency: LatencyTally | None = None, segment_bytes: int = SEGMENT_BYTES_DEFAULT,
                 legacy_file: Path | None = None, cache_bytes: int = CACHE_BYTES_DEFAULT,
                 direct_write_min_bytes: int = DIRECT_WRITE_MIN_BYTES_DEFAULT,
                 on_truncate: Callable[[int], None] | None = None) -> None:
        """``fsync_latency``: where each append fsync's duration is observed (metrics), if given.
        ``on_truncate(index)``: told when the entries from ``index`` on are dropped (a new leader's
        log replaced them: ``StateMachine.journal_truncated``).
        ``direct_write_min_bytes``: records at least this long are written with O_DIRECT (0: none)."""
        if sync_entries not in ("flagged", "all", "never"):
            raise ValueError(f"sync_entries must be flagged, all or never, not {sync_entries!r}")
        if segment_bytes < 1:
            raise ValueError(f"segment_bytes must be positive, not {segment_bytes}")
        if cache_bytes < 0:
            raise ValueError(f"cache_bytes must not be negative, not {cache_bytes}")
        if direct_write_min_bytes < 0:
            raise ValueError(f"direct_write_min_bytes must not be negative, not {direct_write_min_bytes}")
        self._dir = Path(directory)
        self._needs_sync = needs_sync
        self._sync_entries = sync_entries
        self._snapshot_barrier = snapshot_barrier
        self._on_truncate = on_truncate
        self._simulate = simulate_power_loss
        self._segment_bytes = segment_bytes
        # The held entries, oldest first (ascending indexes), position by position in six arrays:
        self._indexes = array("q")
        self._terms = array("q")
        self._sequences = array("q")  # the segment holding its record
        self._offsets = array("q")  # the record's offset in that segment
        self._lengths = array("q")  # the command's length
        self._kinds = array("B")  # the command's first byte: pysyncobj's command type
        self._columns = (self._indexes, self._terms, self._sequences, self._offsets, self._lengths, self._kinds)
        self._cache: list[Entry] = []  # the newest len(_cache) entries, whole
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._head: Entry | None = None  # the first entry, once read back
        self.read_backs = 0  # entries read back from the segments (diagnostics, tests)
        self._segments: list[_Segment] = []  # oldest first; the last one is appended to
        self._term = 0
        self._voted_for: str | None = None
        self._commit = 1
        self._commit_written = 1
        self._size = 0  # bytes written to the last segment
        self._synced_size = 0  # of which known to be on stable storage
        self._sync_pending = False  # a written record must be fsynced before any message leaves
        self._term_pending = False  # ...and it is a term/vote record
        self.fsyncs = 0
        self.fsync_seconds = 0.0  # time spent in the fsyncs of appends (diagnostics)
        self._fsync_latency = fsync_latency
        self.dropped_bytes = 0  # power-loss simulation: unsynced bytes cut off at open
        self.read_at_open_bytes = 0  # bytes of the segments read at open (diagnostics, tests)
        self.unread_at_open_bytes = 0  # commands of sealed segments not read at open (_scan_sealed)
        self.failure: OSError | None = None  # a failed write or fsync: the node must stop sending
        self._fd = -1
        # Large records go past the page cache: a descriptor of the last segment opened with O_DIRECT,
        # the segment's bytes from the block boundary at or before _size to _size (a direct write
        # rewrites that block whole), and an aligned buffer to write from.
        self._direct_min = direct_write_min_bytes
        self._dfd = -1
        self._tail = b""
        self._file_bytes = 0  # the last segment file's length: past _size after a direct write (zeros)
        self._direct_buffer: mmap.mmap | None = None
        self.direct_writes = 0  # records written with O_DIRECT (diagnostics, tests)
        self._crc: Checksum = CHECKSUMS[MAGIC]  # the last segment's (a first-format one keeps zlib's)
        self._worker: ThreadPoolExecutor | None = None  # the journal's own thread: periodic fsyncs, deletions
        self._behind: Future[None] | None = None  # the periodic fsync under way on it
        self._sync_lock = threading.Lock()  # _synced_size and the header's copy: both threads update them
        self.background_fsyncs = 0
        self._dir.mkdir(parents=True, exist_ok=True)
        if legacy_file is not None:
            self._adopt(Path(legacy_file))
        for leftover in self._dir.glob("*" + SEGMENT_SUFFIX + _NEW_SUFFIX):
            leftover.unlink()  # a segment whose creation a crash cut short: never renamed, never used
        sequences = segment_sequences(self._dir)
        if sequences:
            self._open_existing(sequences)
        else:
            self._start_segment(1)

    # -- files -------------------------------------------------------------------------------
    def _adopt(self, legacy: Path) -> None:
        """Move a single-file journal of an earlier release in as segment 1 (one rename: a crash leaves
        either the old file or the segment), then leave ``LEGACY_MARKER`` in its place."""
        if legacy.is_file() and legacy.read_bytes()[:len(LEGACY_MARKER)] != LEGACY_MARKER:
            if segment_sequences(self._dir):
                raise JournalError(f"{legacy} is a journal of an earlier release beside the segments of {self._dir}: "
                                   "move the node's data directory away and let it catch up from the leader")
            os.replace(legacy, self._dir / segment_name(1))
            fsync_path(self._dir)
            logger.info("journal %s: adopted %s as its first segment", self._dir, legacy)
        if not legacy.exists():
            staged = legacy.with_name(legacy.name + _NEW_SUFFIX)
            staged.write_bytes(LEGACY_MARKER + f" the Raft journal is the directory {self._dir.name}/\n".encode())
            fsync_path(staged)
            os.replace(staged, legacy)
            fsync_path(legacy.parent)

    def _open_existing(self, sequences: list[int]) -> None:
        expected = list(range(sequences[0], sequences[0] + len(sequences)))
        if sequences != expected:
            missing = sorted(set(expected) - set(sequences))
            raise JournalError(f"{self._dir}: segment {segment_name(missing[0])} is missing: move the node's data "
                               "directory away and let it catch up from the leader")
        segments = [_Segment(sequence, self._dir / segment_name(sequence)) for sequence in sequences]
        sealed = segments[:-1]
        # Every sealed segment is scanned at once: on a cold page cache each scan waits on the disk
        # one read after the other, and the threads overlap those waits.
        if len(sealed) > 1:
            workers = min(_SCAN_THREADS, len(sealed))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="journal-scan") as pool:
                scans = list(pool.map(self._scan_sealed, [segment.path for segment in sealed]))
        else:
            scans = [self._scan_sealed(segment.path) for segment in sealed]
        for segment, scan in zip(sealed, scans, strict=True):
            if scan is None:
                self._replay_segment(segment, last=False)
            else:
                self._replay_scan(segment, scan)
        self._replay_segment(segments[-1], last=True)
        if self._simulate:
            logger.warning("power-loss simulation: %s cut back to its last fsyncs (dropped %d bytes)",
                           self._dir, self.dropped_bytes)
        self._open_last(self._segments[-1].path)
        if self._indexes:
            self._cache_put(self._read_back(len(self._indexes) - 1, len(self._indexes))[0])
        # Whatever was recovered (written before a process crash) is made durable once, now.
        os.fsync(self._fd)
        self._synced_size = self._size
        self._record_synced_length()
        self._commit_written = self._commit

    def _replay_segment(self, segment: _Segment, *, last: bool) -> None:
        path = segment.path
        data = path.read_bytes()
        self.read_at_open_bytes += len(data)
        magic, _sequence, check = _HEAD.unpack_from(data) if len(data) >= _HEAD.size else (b"", 0, 0)
        crc = CHECKSUMS.get(magic)
        if crc is None or check != crc(data[:16], 0):
            raise JournalError(
                f"{path} is not a raftbroker journal segment (bad header; a journal of pysyncobj's own format is "
                "not read any more): move the node's data directory away and let it catch up from the leader")
        synced, synced_crc = _SIM.unpack_from(data, _HEAD.size)
        if synced_crc != crc(_U64.pack(synced), 0) or synced < HEADER_BYTES:
            logger.warning("journal %s: no valid synced length in the header", path)
            synced = HEADER_BYTES
        end = len(data)
        if self._simulate:
            self.dropped_bytes += max(0, end - synced)
            end = min(end, synced)
        segment.crc = crc
        good = self._replay(data, end, crc, segment)
        if good < min(synced, end):
            # A bad record inside what was fsynced is damage, not a torn write: refuse to guess.
            raise JournalError(f"{path}: corrupt record at offset {good}, inside the {synced} bytes it had "
                               "fsynced: move the node's data directory away and let it catch up from the leader")
        if good < len(data):
            if len(data) - good < _BLOCK and not data[good:].strip(b"\0"):
                logger.debug("journal %s: cutting the zeros that pad its last direct write", path)
            else:
                logger.warning("journal %s: cutting %d bytes after the last whole record", path, len(data) - good)
            os.truncate(path, good)
        self._segments.append(segment)
        if last:
            self._crc = crc
            self._size = self._file_bytes = good
            self._tail = data[good - good % _BLOCK:good]

    def _replay(self, data: bytes, stop: int, crc: Checksum, segment: _Segment) -> int:
        """Apply every whole record in ``data[:stop]``; return the offset after the last good one."""
        pos = HEADER_BYTES
        while pos + _REC.size <= stop:
            length, check, kind = _REC.unpack_from(data, pos)
            end = pos + 8 + length
            if length < 1 or end > stop:
                break
            record = data[pos + 8:end]  # type + payload (one copy: the checksums take no memoryview)
            if crc(record, 0) != check or not self._replay_record(kind, memoryview(record)[1:], pos, segment):
                break
            pos = end
        return pos

    def _replay_record(self, kind: int, payload: memoryview, pos: int, segment: _Segment) -> bool:
        """Apply one checked record found at ``pos`` of ``segment``; False for an unknown type."""
        if kind == ENTRY:
            index, term = _ENTRY.unpack_from(payload)
            length = len(payload) - _ENTRY.size
            self._hold(index, term, segment.sequence, pos, length, payload[_ENTRY.size] if length else 0)
            segment.max_index = max(segment.max_index, index)
        elif kind == TRUNCATE:
            self._drop_from_index(_U64.unpack_from(payload)[0])
        elif kind == TERM:
            self._term = _U64.unpack_from(payload)[0]
            vote = bytes(payload[8:])
            self._voted_for = vote[1:].decode() if vote[:1] == _VOTE else None
        elif kind == COMMIT:
            self._commit = _U64.unpack_from(payload)[0]
        elif kind == COMPACT:
            self._drop_to(bisect_left(self._indexes, _U64.unpack_from(payload)[0]))
        else:
            return False
        return True

    def _scan_sealed(self, path: Path) -> _Scan | None:
        """Read what a replay needs of a sealed segment, without reading its large entries' commands;
        None when its header does not say it is sealed whole (the full read then judges it). Touches
        no state of the journal: the open runs it for every sealed segment at once, on threads, and
        :meth:`_replay_scan` applies the results in order.

        A sealed segment was fsynced whole and its header records that length, so it holds no torn
        tail: what a replay must find there is each entry's index, term and place. Small records
        are read and checked as in the full read; of an entry whose record has at least
        ``_CHECK_LATER_MIN_BYTES``, only the record's header, the entry's index and term and the
        command's first byte are read (one small ``pread``, readahead off), and its checksum is checked
        when the entry is read back (for a follower behind, or the apply after this restart; damage
        then fails the journal, as any damage found after the open does). A header that breaks the
        log's order (an index other than the previous one's + 1, a term below the previous one's) has
        the whole record read and checked. The scan must end exactly at the segment's end, or the
        segment is damaged and refused. So a restart reads the small records and ~4 KiB per large one,
        not the whole log (bench/NOTE.md, 2026-12-04)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, HEADER_BYTES, 0)
            if len(head) < HEADER_BYTES:
                return None
            magic, _sequence, check = _HEAD.unpack_from(head)
            crc = CHECKSUMS.get(magic)
            if crc is None or check != crc(head[:16], 0):
                return None
            synced, synced_crc = _SIM.unpack_from(head, _HEAD.size)
            if synced_crc != crc(_U64.pack(synced), 0) or synced != size:
                return None
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # the skipped commands are not read ahead
            scan = _Scan(crc, size)
            self._scan(fd, scan)
            return scan
        finally:
            os.close(fd)

    @staticmethod
    def _scan(fd: int, scan: _Scan) -> None:
        """:meth:`_scan_sealed`'s loop."""
        size, crc, found = scan.size, scan.crc, scan.found
        pos = HEADER_BYTES
        buf, at = b"", pos  # bytes read from offset ``at``
        last_index, last_term = -1, -1  # the previous entry of this segment (-1: none yet)
        while pos + _REC.size <= size:
            rel = pos - at
            if rel + _COMMAND_AT > len(buf):
                buf, at, rel = os.pread(fd, min(_PEEK_BYTES, size - pos), pos), pos, 0
                scan.read_bytes += len(buf)
                if len(buf) < _REC.size:
                    break
            length, check, kind = _REC.unpack_from(buf, rel)
            end = pos + 8 + length
            if length < 1 or end > size or not ENTRY <= kind <= COMPACT:
                break
            if kind == ENTRY and length >= _CHECK_LATER_MIN_BYTES and rel + _COMMAND_AT < len(buf):
                index, term = _ENTRY.unpack_from(buf, rel + _REC.size)
                if last_index < 0 or (index == last_index + 1 and term >= last_term):
                    found.append((_UNCHECKED, pos, length, (index, term, buf[rel + _COMMAND_AT], check)))
                    scan.unread_bytes += length - _COMMAND_AT + 8
                    last_index, last_term = index, term
                    pos = end
                    continue
            if end - at > len(buf):
                buf, at, rel = os.pread(fd, max(_SCAN_CHUNK_BYTES, end - pos), pos), pos, 0
                scan.read_bytes += len(buf)
                if len(buf) < end - pos:
                    break
            record = buf[rel + 8:rel + 8 + length]
            if crc(record, 0) != check:
                break
            if kind == ENTRY:  # kept as its index, term and first byte, not its command
                index, term = _ENTRY.unpack_from(record, 1)
                found.append((ENTRY, pos, length, (index, term, record[_COMMAND_IN_RECORD]
                                                   if length > _COMMAND_IN_RECORD else 0, 0)))
                last_index, last_term = index, term
            else:
                found.append((kind, pos, length, record))
            pos = end
        scan.good = pos

    def _replay_scan(self, segment: _Segment, scan: _Scan) -> None:
        """Apply what :meth:`_scan_sealed` found in ``segment``, in order."""
        segment.crc = scan.crc
        self.read_at_open_bytes += scan.read_bytes
        self.unread_at_open_bytes += scan.unread_bytes
        good = scan.good
        for kind, pos, length, item in scan.found:
            if kind in (ENTRY, _UNCHECKED):
                index, term, first, check = item
                held = self._indexes
                if kind == _UNCHECKED and held and (index != held[-1] + 1 or term < self._terms[-1]):
                    # out of the log's order: read the record and check it before believing its header
                    with open(segment.path, "rb") as handle:
                        record = os.pread(handle.fileno(), length, pos + 8)
                    self.read_at_open_bytes += len(record)
                    if len(record) != length or scan.crc(record, 0) != check:
                        good = pos
                        break
                self._hold(index, term, segment.sequence, pos, length - _COMMAND_IN_RECORD, first)
                segment.max_index = max(segment.max_index, index)
            elif not self._replay_record(kind, memoryview(item)[1:], pos, segment):
                good = pos
                break
        if good != scan.size:
            raise JournalError(f"{segment.path}: corrupt record at offset {good}, inside the {scan.size} bytes it had "
                               "fsynced: move the node's data directory away and let it catch up from the leader")
        self._segments.append(segment)

    def _drop_from_index(self, index: int) -> None:
        self._drop_from(bisect_left(self._indexes, index))

    # -- the held entries ----------------------------------------------------------------------
    def _hold(self, index: int, term: int, sequence: int, offset: int, length: int, kind: int) -> None:
        self._kinds.append(kind)
        self._indexes.append(index)
        self._terms.append(term)
        self._sequences.append(sequence)
        self._offsets.append(offset)
        self._lengths.append(length)

    def _cache_put(self, entry: Entry) -> None:
        """``entry`` is the newest held one: cache it, and drop the oldest cached ones past the limit
        (a quarter under it at once, so the list is not shifted for every entry)."""
        cache = self._cache
        cache.append(entry)
        self._cache_bytes += len(entry[0])
        if self._cache_bytes > self._cache_limit and len(cache) > 1:
            floor, dropped, count = self._cache_limit * 3 // 4, 0, 0
            while count < len(cache) - 1 and self._cache_bytes - dropped > floor:
                dropped += len(cache[count][0])
                count += 1
            del cache[:count]
            self._cache_bytes -= dropped

    def _drop_from(self, position: int) -> None:
        """Forget the held entries from ``position`` on (a truncation)."""
        held = len(self._indexes)
        if position >= held:
            return
        cached_from = held - len(self._cache)
        for column in self._columns:
            del column[position:]
        if position <= cached_from:
            self._cache, self._cache_bytes = [], 0
        else:
            for entry in self._cache[position - cached_from:]:
                self._cache_bytes -= len(entry[0])
            del self._cache[position - cached_from:]
        if position == 0:
            self._head = None
        if self._indexes and not self._cache and self._fd >= 0:
            self._cache_put(self._read_back(position - 1, position)[0])

    def _drop_to(self, position: int) -> None:
        """Forget the held entries before ``position`` (a compaction)."""
        if position <= 0:
            return
        held = len(self._indexes)
        position = min(position, held)
        for column in self._columns:
            del column[:position]
        excess = len(self._cache) - (held - position)
        if excess > 0:
            for entry in self._cache[:excess]:
                self._cache_bytes -= len(entry[0])
            del self._cache[:excess]
        self._head = None

    def _segment(self, sequence: int) -> _Segment:
        first = self._segments[0].sequence
        segment = self._segments[sequence - first]
        assert segment.sequence == sequence
        return segment

    def _read_back(self, start: int, stop: int) -> list[Entry]:
        """The held entries at positions ``[start, stop)``, read from their segments: one ``pread``
        per run of them in one segment, each record's checksum checked (damage since the journal was
        opened is a failure of the journal, as a failed write is)."""
        out: list[Entry] = []
        sequences, offsets, lengths = self._sequences, self._offsets, self._lengths
        position = start
        while position < stop:
            sequence = sequences[position]
            run_end = position + 1
            while run_end < stop and sequences[run_end] == sequence:
                run_end += 1
            segment = self._segment(sequence)
            base = offsets[position]
            size = offsets[run_end - 1] + _COMMAND_AT + lengths[run_end - 1] - base
            try:
                if segment.reader < 0:
                    segment.reader = os.open(segment.path, os.O_RDONLY)
                data = os.pread(segment.reader, size, base)
            except OSError as exc:
                self._fail(exc)
                raise
            view = memoryview(data)
            for at in range(position, run_end):
                pos = offsets[at] - base
                end = pos + _COMMAND_AT + lengths[at]
                length, check, _kind = _REC.unpack_from(data, pos) if end <= len(data) else (0, 0, 0)
                record = view[pos + 8:end]
                if length != end - pos - 8 or segment.crc(bytes(record), 0) != check:
                    damage = OSError(f"{segment.path}: the record of entry {self._indexes[at]} at offset "
                                     f"{offsets[at]} is damaged or missing")
                    self._fail(damage)
                    raise JournalError(str(damage))
                out.append((bytes(view[pos + _COMMAND_AT:end]), self._indexes[at], self._terms[at]))
            position = run_end
        self.read_backs += stop - start
        return out

    def _entries(self, start: int, stop: int) -> list[Entry]:
        """The held entries at positions ``[start, stop)`` (0 <= start <= stop <= held)."""
        cached_from = len(self._indexes) - len(self._cache)
        if start >= cached_from:
            return self._cache[start - cached_from:stop - cached_from]
        if stop <= cached_from:
            return self._read_back(start, stop)
        return self._read_back(start, cached_from) + self._cache[:stop - cached_from]

    def entries_from(self, index: int, count: int | None = None, max_bytes: int | None = None) -> list[Entry]:
        """pysyncobj's ``__getEntries``: up to ``count`` entries from Raft ``index`` on, cut after the one
        that brings their commands to ``max_bytes``, without reading back any past the cut."""
        if not self._indexes or index < self._indexes[0]:
            return []
        held = len(self._indexes)
        start = index - self._indexes[0]
        if start >= held:
            return []
        stop = held if count is None else min(held, start + max(count, 0))
        if max_bytes is not None:
            total, lengths = 0, self._lengths
            for position in range(start, stop):
                total += lengths[position]
                if total >= max_bytes:
                    stop = position + 1
                    break
        return self._entries(start, stop)

    def _span(self, index: int, stop: int) -> tuple[int, int]:
        """The positions of the held entries with Raft indexes in ``[index, stop)``."""
        if not self._indexes:
            return 0, 0
        first, held = self._indexes[0], len(self._indexes)
        return min(held, max(0, index - first)), min(held, max(0, stop - first))

    def command_kinds(self, index: int, stop: int) -> bytes:
        """The first byte of each held command with a Raft index in ``[index, stop)`` (pysyncobj's
        command type: regular, no-op, membership, version), read from memory, not from the segments."""
        start, end = self._span(index, stop)
        return self._kinds[start:end].tobytes()

    def command_bytes(self, index: int, stop: int) -> int:
        """The total length of the held commands with a Raft index in ``[index, stop)``, from memory."""
        start, end = self._span(index, stop)
        return sum(self._lengths[start:end])

    def entry_bytes(self, index: int) -> int | None:
        """The command length of the entry at Raft ``index``, None when it is not held (safe from
        another thread: a compaction racing it gives None)."""
        try:
            position = index - self._indexes[0]
            if not 0 <= position < len(self._indexes) or self._indexes[position] != index:
                return None
            return self._lengths[position]
        except IndexError:
            return None

    @property
    def cached_bytes(self) -> int:
        """Bytes of commands held in memory (the newest entries, the first one aside)."""
        return self._cache_bytes

    def _fail(self, exc: OSError) -> None:
        logger.critical("raft journal %s failed; this node sends nothing more", self._dir, exc_info=exc)
        self.failure = exc
        self._sync_pending = self._term_pending = True  # holds every message back for good

    def _first_kept(self) -> int:
        return self._indexes[0] if self._indexes else _EVERY_INDEX

    def _start_segment(self, sequence: int) -> None:
        """Write a new last segment holding the state that is not an entry, fsync it and rename it in
        place; appends go to it from now on."""
        crc = CHECKSUMS[MAGIC]  # a new segment is written in the current format
        records = (_record(crc, TERM, _term_payload(self._term, self._voted_for))
                   + _record(crc, COMMIT, _U64.pack(self._commit))
                   + _record(crc, COMPACT, _U64.pack(self._first_kept())))
        data = _header(sequence, HEADER_BYTES + len(records)) + records
        path = self._dir / segment_name(sequence)
        staged = path.with_name(path.name + _NEW_SUFFIX)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staged, path)
        fsync_path(self._dir)
        self._wait_behind()
        self._close_last()
        self._open_last(path)
        self._segments.append(_Segment(sequence, path, crc))
        self._crc = crc
        self._size = self._synced_size = self._file_bytes = len(data)
        self._tail = data[len(data) - len(data) % _BLOCK:]
        self._sync_pending = self._term_pending = False  # term and vote are in the fsynced segment
        self._commit_written = self._commit
        self.fsyncs += 1

    def _seal(self) -> None:
        """fsync the last segment and record its whole length as synced, then start the next one."""
        try:
            self._cut_padding()
        except OSError as exc:
            self._fail(exc)
            raise
        self._fsync()
        try:
            _datasync(self._fd)  # the header's synced length, which _fsync wrote after its fsync
            self._start_segment(self._segments[-1].sequence + 1)
        except OSError as exc:
            self._fail(exc)
            raise

    def _delete_segments(self, count: int) -> None:
        """Drop the ``count`` oldest segments (never the last one) and delete their files on the
        deleter thread: unlinking a 64 MiB file takes ~30 ms here, too long for the replication
        thread. The caller has made the record that supersedes them durable (COMPACT), so a file a
        crash leaves behind is a prefix of the segments whose entries the replay drops; the files go
        in ascending order, so the sequences left stay without a gap."""
        assert count < len(self._segments)
        paths = [segment.path for segment in self._segments[:count]]
        for segment in self._segments[:count]:
            segment.close_reader()
        del self._segments[:count]
        self._submit(self._unlink, paths)

    def _submit(self, job: Callable[..., None], *args: Any) -> Future[None]:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-io")
        return self._worker.submit(job, *args)

    def _unlink(self, paths: list[Path]) -> None:
        try:
            for path in paths:
                path.unlink(missing_ok=True)
            fsync_path(self._dir)
        except OSError:  # left for the next open, whose replay drops their entries again
            logger.warning("journal %s: could not delete passed segments", self._dir, exc_info=True)

    def settle(self) -> None:
        """Wait until the journal's own thread has done what it was given: the segments dropped so far
        are deleted, a periodic fsync under way is done (tests; ``_destroy``)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        self._behind = None

    def _wait_behind(self) -> None:
        """Wait for a periodic fsync under way: it holds the last segment's descriptor."""
        behind, self._behind = self._behind, None
        if behind is not None:
            behind.result()

    def _append(self, kind: int, payload: bytes, needs_sync: bool, tail: bytes = b"") -> None:
        """Write a record of ``payload + tail`` at the end (``tail``, a command, is not copied by a
        write through the page cache)."""
        head, body = _record_parts(self._crc, kind, payload, tail)
        size = len(head) + len(body)
        try:
            if self._dfd >= 0 and size >= self._direct_min and self._size >= _BLOCK and self._write_direct(head, body):
                written = size
            elif body:
                written = os.pwritev(self._fd, (head, body), self._size)
            else:
                written = os.pwrite(self._fd, head, self._size)
            if written != size:
                raise OSError(f"short write to the raft journal ({written} of {size} bytes)")
        except OSError as exc:
            self._fail(exc)
            raise
        self._keep_tail(head, body)
        self._size += written
        self._file_bytes = max(self._file_bytes, self._size)
        if needs_sync:
            self._sync_pending = True

    # -- writes past the page cache ----------------------------------------------------------
    def _open_last(self, path: Path) -> None:
        """Open the segment appended to, for writes through the page cache and, unless they are off
        or the file system refuses them (tmpfs), with O_DIRECT."""
        self._fd = os.open(path, os.O_WRONLY)
        if self._direct_min and hasattr(os, "O_DIRECT"):
            try:
                self._dfd = os.open(path, os.O_WRONLY | os.O_DIRECT)
            except OSError as exc:
                self._direct_off(exc)

    def _close_last(self) -> None:
        for fd in (self._fd, self._dfd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._dfd = -1

    def _direct_off(self, exc: OSError) -> None:
        logger.info("journal %s: writes through the page cache only (O_DIRECT refused: %s)", self._dir, exc)
        self._direct_min = 0
        if self._dfd >= 0:
            os.close(self._dfd)
            self._dfd = -1

    def _write_direct(self, head: bytes, body: bytes) -> bool:
        """Write ``head + body`` at the end with O_DIRECT: the block that holds the end is written
        again whole, from ``_tail``, and the last block is padded with zeros (the next record
        overwrites them; a replay stops at them, as at any torn tail). False when the file system
        refuses it (then the caller writes through the page cache, and so does every later append)."""
        tail = self._tail
        base = self._size - len(tail)
        length = len(tail) + len(head) + len(body)
        padded = -(-length // _BLOCK) * _BLOCK
        one_off = padded > _ONE_OFF_BUFFER_BYTES
        buffer = self._direct_buffer
        if one_off:
            buffer = mmap.mmap(-1, padded)
        elif buffer is None or len(buffer) < padded:
            if buffer is not None:
                buffer.close()
            buffer = self._direct_buffer = mmap.mmap(-1, max(padded, 256 * 1024))
        try:
            at = len(tail)
            buffer[:at] = tail
            buffer[at:at + len(head)] = head
            at += len(head)
            buffer[at:at + len(body)] = body
            at += len(body)
            buffer[at:padded] = bytes(padded - at)
            with memoryview(buffer) as view:
                try:
                    written = os.pwrite(self._dfd, view[:padded], base)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:
                        raise
                    self._direct_off(exc)
                    return False
        finally:
            if one_off:
                buffer.close()
        if written != padded:
            raise OSError(f"short direct write to the raft journal ({written} of {padded} bytes)")
        self._file_bytes = max(self._file_bytes, base + padded)
        self.direct_writes += 1
        return True

    def _cut_padding(self) -> None:
        """Cut the zeros that pad the last direct write off the segment (before it is sealed or closed,
        so that a segment at rest ends at its last record)."""
        if self._file_bytes > self._size:
            os.ftruncate(self._fd, self._size)
            self._file_bytes = self._size

    def _keep_tail(self, head: bytes, body: bytes) -> None:
        """``head + body`` was just written at ``_size``: keep the bytes of the block that now holds
        the end (the next direct write rewrites it)."""
        end = self._size + len(head) + len(body)
        keep = end % _BLOCK
        if end - keep == self._size - len(self._tail):  # the same block: the record is shorter than one
            self._tail += head + body
        elif keep <= len(body):
            self._tail = bytes(body[len(body) - keep:]) if keep else b""
        else:
            self._tail = (head + body)[-keep:]

    def _entry_needs_sync(self, command: bytes) -> bool:
        if self._sync_entries == "never":
            return False
        return self._sync_entries == "all" or self._needs_sync(command)

    # -- syncing -----------------------------------------------------------------------------
    @property
    def sync_pending(self) -> bool:
        """True while a written record must reach stable storage before any message leaves."""
        return self._sync_pending

    @property
    def term_pending(self) -> bool:
        """True while a term/vote record waits for its fsync (no message may leave before it)."""
        return self._term_pending

    @property
    def unsynced_bytes(self) -> int:
        return self._size - self._synced_size

    def sync(self) -> bool:
        """fsync if a sync is pending; True when it did."""
        if not self._sync_pending:
            return False
        self._fsync()
        return True

    def _fsync(self) -> None:
        if self.failure is not None:  # after a failed fsync nothing can be trusted to be durable
            raise self.failure
        size = self._size
        started = monotonic()
        try:
            _datasync(self._fd)  # appends: the data and the new file size
        except OSError as exc:
            self._fail(exc)
            raise
        elapsed_s = monotonic() - started
        self.fsync_seconds += elapsed_s
        self.fsyncs += 1
        if self._fsync_latency is not None:
            self._fsync_latency.observe(elapsed_s)
        self._sync_pending = self._term_pending = False
        self._mark_synced(self._fd, size)

    def _sync_behind(self) -> None:
        """Start an fsync of what is written so far on the journal's own thread, unless one is under
        way. It is the periodic one that bounds what a power loss takes from `disk` entries: nothing
        waits for it, so the replication thread goes on (an fdatasync takes 1-10 ms on a busy disk)."""
        if self._behind is not None and not self._behind.done():
            return
        if self.failure is not None:
            return
        self._behind = self._submit(self._sync_job, self._fd, self._size)

    def _sync_job(self, fd: int, size: int) -> None:
        started = monotonic()
        try:
            _datasync(fd)
        except OSError as exc:
            self._fail(exc)  # the transport holds every message from now on, as after a failed fsync in line
            return
        if self._fsync_latency is not None:
            self._fsync_latency.observe(monotonic() - started)
        self._mark_synced(fd, size)
        self.background_fsyncs += 1

    def _mark_synced(self, fd: int, size: int) -> None:
        """``size`` bytes of the last segment are on stable storage: so says its header from now on."""
        with self._sync_lock:
            if size > self._synced_size:
                self._synced_size = size
                self._record_synced_length(fd)

    def _record_synced_length(self, fd: int = -1) -> None:
        # Stable with the next fsync. At open, damage before it is corruption (refused), after it a
        # torn tail (cut); the power-loss simulation cuts the segment back to it.
        synced = _U64.pack(self._synced_size)
        os.pwrite(self._fd if fd < 0 else fd, synced + struct.pack("<I", self._crc(synced, 0)), _HEAD.size)

    # -- pysyncobj's Journal interface -------------------------------------------------------
    def add(self, command: bytes, idx: int, term: int) -> None:
        if self._size >= self._segment_bytes:
            self._seal()
        offset = self._size
        self._append(ENTRY, _ENTRY.pack(idx, term), self._entry_needs_sync(command), command)
        segment = self._segments[-1]
        if idx > segment.max_index:
            segment.max_index = idx
        self._hold(idx, term, segment.sequence, offset, len(command), command[0] if command else 0)
        self._cache_put((command, idx, term))

    def clear(self) -> None:
        if self._snapshot_barrier is not None:
            self._snapshot_barrier()  # the snapshot that replaces every entry is on disk first
        self._drop_from(0)
        try:
            self._start_segment(self._segments[-1].sequence + 1)  # its COMPACT drops every entry
            self._delete_segments(len(self._segments) - 1)
        except OSError as exc:
            self._fail(exc)
            raise

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802 (pysyncobj's name)
        if entryFrom >= len(self._indexes):
            return
        index = self._indexes[entryFrom]
        self._drop_from(entryFrom)
        self._append(TRUNCATE, _U64.pack(index), self._sync_entries != "never")
        if self._on_truncate is not None:
            self._on_truncate(index)

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802
        if entryTo <= 0:
            return
        if self._snapshot_barrier is not None:
            self._snapshot_barrier()  # the snapshot that replaces the dropped prefix is on disk first
        self._drop_to(entryTo)
        keep = self._first_kept()
        self._append(COMPACT, _U64.pack(keep), False)
        covered = 0
        for segment in self._segments[:-1]:
            if segment.max_index >= keep:
                break
            covered += 1
        if covered:
            self._fsync()  # the COMPACT record first: no replay looks for an entry of a deleted segment
            try:
                self._delete_segments(covered)
            except OSError as exc:
                self._fail(exc)
                raise

    def __getitem__(self, item: Any) -> Any:
        if item.__class__ is int and 0 > item >= -len(self._cache):
            return self._cache[item]  # pysyncobj reads the last entry several times per tick
        held = len(self._indexes)
        if isinstance(item, slice):
            start, stop, step = item.indices(held)
            if step != 1:
                raise ValueError("the journal is sliced with step 1 only")
            return self._entries(start, max(start, stop))
        position = item + held if item < 0 else item
        if not 0 <= position < held:
            raise IndexError("journal position out of range")
        cached = position - held + len(self._cache)
        if cached >= 0:
            return self._cache[cached]
        if position == 0:
            if self._head is None:
                self._head = self._read_back(0, 1)[0]
            return self._head
        return self._read_back(position, position + 1)[0]

    def __len__(self) -> int:
        return len(self._indexes)

    def _destroy(self) -> None:
        self.settle()
        for segment in self._segments:
            segment.close_reader()
        if self._fd < 0:
            return
        if self.failure is None:
            self._cut_padding()
            if self.unsynced_bytes:
                self._fsync()  # a clean stop leaves nothing to lose
        self._close_last()
        if self._direct_buffer is not None:
            self._direct_buffer.close()
            self._direct_buffer = None

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        self._commit = raftCommitIndex  # written lazily (once a second): it is a hint, never synced

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return self._commit

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:  # noqa: N802, N803
        self._term = term
        self._voted_for = votedForNodeId
        self._append(TERM, _term_payload(term, votedForNodeId), True)  # Raft safety: always synced
        self._term_pending = True

    def getCurrentTerm(self) -> int:  # noqa: N802
        return self._term

    def getVotedForNodeId(self) -> str | None:  # noqa: N802
        return self._voted_for

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self._commit != self._commit_written:
            self._append(COMMIT, _U64.pack(self._commit), False)
            self._commit_written = self._commit
        # Bound what a power loss can take from `disk` entries to about a second of writes.
        if self.unsynced_bytes and self._sync_entries != "never":
            self._sync_behind()

    @property
    def path(self) -> Path:
        """The journal's directory."""
        return self._dir

    @property
    def generation(self) -> int:
        """The sequence of the segment appended to."""
        return self._segments[-1].sequence

    @property
    def segment_paths(self) -> list[Path]:
        """The segments, oldest first."""
        return [segment.path for segment in self._segments]


class SyncingTransport(TCPTransport):
    """pysyncobj's TCP transport, holding every message back while the journal has a sync pending.

    Messages keep their order: once one is held, the following ones are held too. :meth:`release`
    fsyncs once and sends them all; the node calls it before and after each socket poll (see
    :class:`ReleasingPoller`), so one fsync covers everything appended in between (group commit).
    A message held for ``max_hold_s`` releases at once (a tick may run for 50 ms).

    One exception (Raft thesis §10.2.1): a leader's AppendEntries may leave before the leader's own
    fsync, unless a term/vote record is pending. The leader counts itself in a commit, but it
    fsyncs in the release before its next poll, before it can read any reply; so its fsync runs
    while the followers receive and sync, instead of before.
    """

    max_hold_s = 0.002

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803 (pysyncobj's names)
        self._held: list[tuple[Any, Any]] = []
        self._held_since = 0.0
        super().__init__(syncObj, selfNode, otherNodes)

    def _journal(self) -> DurableJournal | None:
        journal = getattr(self._syncObj, "_SyncObj__raftLog", None)
        return journal if isinstance(journal, DurableJournal) else None

    def send(self, node: Any, message: Any) -> bool:
        journal = self._journal()
        if journal is None or (not self._held and not journal.sync_pending):
            return bool(super().send(node, message))
        if not journal.term_pending and isinstance(message, dict) and message.get("type") == "append_entries":
            return bool(super().send(node, message))  # the leader's own entries: see the class docstring
        connection = self._connections.get(node)
        if connection is None or connection.state != CONNECTION_STATE.CONNECTED:
            return False
        if not self._held:
            self._held_since = monotonic()
        self._held.append((node, message))
        if monotonic() - self._held_since >= self.max_hold_s:
            self.release()
        return True

    def release(self) -> None:
        """fsync the journal if a sync is pending, then send the held messages in order."""
        journal = self._journal()
        if journal is not None:
            journal.sync()
        if not self._held:
            return
        held, self._held = self._held, []
        for node, message in held:
            super().send(node, message)

    @property
    def held_count(self) -> int:
        return len(self._held)


class ReleasingPoller:
    """Wraps pysyncobj's poller: releases held messages before waiting and after dispatching.
    ``wait_s`` (optional) turns a positive timeout into the one to wait (the node's idle poll,
    ``_RaftNode._poll_wait_s``); it is asked after the release, so it sees what the tick left."""

    def __init__(self, inner: Any, release: Callable[[], None],
                 wait_s: Callable[[float], float] | None = None) -> None:
        self._inner = inner
        self._release = release
        self._wait_s = wait_s

    def poll(self, timeout: float) -> None:
        self._release()  # what the tick appended and sent
        if timeout > 0 and self._wait_s is not None:
            timeout = self._wait_s(timeout)
        self._inner.poll(timeout)
        self._release()  # replies to the messages just handled

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
