"""The snapshot pysyncobj stores and ships: a kept state-machine checkpoint plus Raft metadata.

pysyncobj keeps one "full dump" file per node, written at log compaction and streamed to followers
that are too far behind. :class:`SnapshotCodec` provides its ``serializer``/``deserializer`` pair
and the file a transmission reads. Two forms of the dump exist, both uncompressed tars whose first
member is ``raft-data.pickle`` (pysyncobj's ``raftData`` tuple, first so it can be read without
scanning the rest):

- **Local** (written at compaction): ``raft-data.pickle`` and ``checkpoint.json``, which names a
  checkpoint directory kept under ``checkpoints_dir`` (the directory written by
  :meth:`StateMachine.write_snapshot`; for RocksDB, hard links to its table files) and the size of
  every file in it. A compaction therefore costs the checkpoint and an fsync of its files, not a
  read, CRC and copy of the whole store.
- **Full** (what a follower receives): ``raft-data.pickle``, every state file under ``state/``, and
  ``manifest.json`` (size and CRC-32 of every state file, checked on restore). A local dump is
  turned into this form only while it is sent: :meth:`SnapshotCodec.open_for_transmission` returns a
  reader that writes the tar's headers and the checkpoint's files as pysyncobj asks for chunks,
  computing the CRCs on the way, with the manifest last. The files are all opened when the
  transmission starts, so a newer compaction may delete the directory meanwhile.

Checkpoint directories are named ``<index>-<ns>``. The one the dump in place names is kept; others
are deleted once a newer dump is in place, after a full snapshot is installed, and at start.
No pysyncobj import is needed here.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import pickle
import re
import shutil
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NamedTuple

from broker.replication import StateMachine
from broker.replication.stats import LatencyTally
from broker.replication.transport import restricted_loads

logger = logging.getLogger(__name__)

RAFT_DATA_NAME = "raft-data.pickle"
MANIFEST_NAME = "manifest.json"
CHECKPOINT_NAME = "checkpoint.json"
STATE_PREFIX = "state/"
CHECKPOINTS_DIR_NAME = "snapshots"
_COPY_CHUNK_BYTES = 1 << 20
_CHECKPOINT_DIR_RE = re.compile(r"[0-9]+-[0-9]+")


class SnapshotError(Exception):
    """A snapshot file that is malformed or does not match its manifest."""


def snapshot_index(raft_data: object) -> int:
    """The Raft index a snapshot covers: ``raftData`` is (last applied entry, previous entry, nodes)
    and an entry is (command, index, term)."""
    if not (isinstance(raft_data, tuple) and len(raft_data) == 3):
        raise SnapshotError(f"raftData must be a 3-tuple, got {type(raft_data).__name__}")
    last_applied = raft_data[0]
    if not (isinstance(last_applied, tuple) and len(last_applied) == 3 and isinstance(last_applied[1], int)):
        raise SnapshotError("raftData[0] must be a (command, index, term) entry")
    index = last_applied[1]
    if index < 1:
        raise SnapshotError(f"snapshot index must be positive, got {index}")
    return index


def _read_head(tar: tarfile.TarFile, file_name: str) -> tuple[bytes, tarfile.TarInfo]:
    first = tar.next()
    if first is None or first.name != RAFT_DATA_NAME:
        raise SnapshotError(f"{file_name}: first member must be {RAFT_DATA_NAME}")
    extracted = tar.extractfile(first)
    assert extracted is not None
    return extracted.read(), first


def read_raft_data(file_name: str) -> tuple[object, ...]:
    """The ``raftData`` tuple of the snapshot file ``file_name`` (its first tar member), read without
    restoring anything: lets a follower compare a received snapshot with its own log first."""
    with tarfile.open(file_name, mode="r:") as tar:
        raft_data = pickle.loads(_read_head(tar, file_name)[0])
    snapshot_index(raft_data)  # validates the shape
    assert isinstance(raft_data, tuple)
    return raft_data


def _state_files(root: Path) -> Iterator[tuple[str, Path]]:
    for directory, _subdirs, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = Path(directory) / name
            yield path.relative_to(root).as_posix(), path


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _safe_relative(name: str) -> PurePosixPath:
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise SnapshotError(f"unsafe path in snapshot: {name!r}")
    return relative


# -- the tar format, written as a stream ---------------------------------------------------------
def _member(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = int(time.time())
    info.mode = 0o644
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def _padding(size: int) -> bytes:
    remainder = size % tarfile.BLOCKSIZE
    return tarfile.NUL * (tarfile.BLOCKSIZE - remainder) if remainder else b""


def _bytes_member(name: str, data: bytes) -> bytes:
    return _member(name, len(data)) + data + _padding(len(data))


def _full_tar(raft_data_bytes: bytes, index: int, files: list[tuple[str, BinaryIO, int]]) -> Iterator[bytes]:
    """The chunks of a full snapshot: raft data, every ``(relative name, open file, size)`` under
    ``state/``, the manifest (sizes and CRC-32s computed on the way), the end of the archive."""
    written = 0

    def counted(chunk: bytes) -> bytes:
        nonlocal written
        written += len(chunk)
        return chunk

    yield counted(_bytes_member(RAFT_DATA_NAME, raft_data_bytes))
    manifest: dict[str, list[int]] = {}
    for relative, source, size in files:
        yield counted(_member(STATE_PREFIX + relative, size))
        crc32, remaining = 0, size
        while remaining:
            chunk = source.read(min(_COPY_CHUNK_BYTES, remaining))
            if not chunk:
                raise SnapshotError(f"state file {relative} shrank while it was sent")
            crc32 = zlib.crc32(chunk, crc32)
            remaining -= len(chunk)
            yield counted(chunk)
        yield counted(_padding(size))
        manifest[relative] = [size, crc32]
    yield counted(_bytes_member(MANIFEST_NAME, json.dumps({"index": index, "files": manifest}).encode()))
    end = tarfile.NUL * (2 * tarfile.BLOCKSIZE)
    written += len(end)
    remainder = written % tarfile.RECORDSIZE
    yield end + (tarfile.NUL * (tarfile.RECORDSIZE - remainder) if remainder else b"")


def _close_all(files: list[tuple[str, BinaryIO, int]]) -> None:
    for _, source, _ in files:
        source.close()


def _open_files(root: Path, sizes: dict[str, int] | None = None) -> list[tuple[str, BinaryIO, int]]:
    """Open every file under ``root`` (sorted); with ``sizes``, exactly those files at those sizes."""
    names = sorted(sizes) if sizes is not None else [relative for relative, _ in _state_files(root)]
    opened: list[tuple[str, BinaryIO, int]] = []
    try:
        for relative in names:
            source: BinaryIO = open(root.joinpath(*_safe_relative(relative).parts), "rb")  # noqa: SIM115 (closed by the caller)
            size = os.fstat(source.fileno()).st_size
            opened.append((relative, source, size))
            if sizes is not None and sizes[relative] != size:
                raise SnapshotError(f"checkpoint file {relative} has {size} bytes, the snapshot says {sizes[relative]}")
    except BaseException:
        _close_all(opened)
        raise
    return opened


class TransmissionReader:
    """A read-only file over chunks made on demand (a full snapshot made from a kept checkpoint)."""

    def __init__(self, chunks: Iterator[bytes], files: list[tuple[str, BinaryIO, int]]) -> None:
        self._chunks = chunks
        self._files = files
        self._buffer = bytearray()
        self._done = False

    def read(self, size: int = -1) -> bytes:
        while not self._done and (size < 0 or len(self._buffer) < size):
            chunk = next(self._chunks, None)
            if chunk is None:
                self.close()
            else:
                self._buffer += chunk
        if size < 0 or size >= len(self._buffer):
            data, self._buffer = bytes(self._buffer), bytearray()
        else:
            data = bytes(self._buffer[:size])
            del self._buffer[:size]
        return data

    def close(self) -> None:
        self._done = True
        _close_all(self._files)

    def __del__(self) -> None:  # pysyncobj drops a cancelled transmission without closing its file
        self.close()


def pack(state_dir: Path, raft_data: object, target: Path) -> int:
    """Write a full snapshot of ``raft_data`` and every file under ``state_dir`` into the tar
    ``target`` (fsynced): what a follower receives. Return the number of state files."""
    index = snapshot_index(raft_data)
    files = _open_files(state_dir)
    try:
        with open(target, "wb") as raw:
            for chunk in _full_tar(pickle.dumps(raft_data, protocol=5), index, files):
                raw.write(chunk)
            raw.flush()
            os.fsync(raw.fileno())
    finally:
        _close_all(files)
    return len(files)


def _write_local_dump(target: Path, raft_data: object, checkpoint: str, sizes: dict[str, int]) -> None:
    pointer = {"index": snapshot_index(raft_data), "checkpoint": checkpoint, "files": sizes}
    with open(target, "wb") as raw:
        raw.write(_bytes_member(RAFT_DATA_NAME, pickle.dumps(raft_data, protocol=5)))
        raw.write(_bytes_member(CHECKPOINT_NAME, json.dumps(pointer).encode()))
        raw.write(tarfile.NUL * tarfile.RECORDSIZE)  # the end of the archive (two blocks), padded
        raw.flush()
        os.fsync(raw.fileno())


def _read_pointer(tar: tarfile.TarFile, file_name: str, index: int) -> tuple[str, dict[str, int]] | None:
    """The checkpoint a local dump names and its files' sizes; None for a full snapshot."""
    second = tar.next()
    if second is None or second.name != CHECKPOINT_NAME:
        return None
    extracted = tar.extractfile(second)
    assert extracted is not None
    try:
        pointer = json.loads(extracted.read())
        name, sizes = pointer["checkpoint"], pointer["files"]
        valid = (pointer["index"] == index and isinstance(name, str) and _CHECKPOINT_DIR_RE.fullmatch(name)
                 and isinstance(sizes, dict) and all(isinstance(k, str) and type(v) is int for k, v in sizes.items()))
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotError(f"{file_name}: unreadable {CHECKPOINT_NAME}: {exc}") from exc
    if not valid:
        raise SnapshotError(f"{file_name}: malformed {CHECKPOINT_NAME}")
    return name, sizes


class _Head(NamedTuple):
    """What a snapshot file's first members say."""

    raft_bytes: bytes
    raft_data: tuple[object, ...]
    at_index: int  # the snapshot index
    first: tarfile.TarInfo
    pointer: tuple[str, dict[str, int]] | None  # a local dump's checkpoint and file sizes; None: a full one


def _head(tar: tarfile.TarFile, file_name: str) -> _Head:
    raft_bytes, first = _read_head(tar, file_name)
    raft_data = restricted_loads(raft_bytes)  # it may come from a peer: no globals but TCPNode
    index = snapshot_index(raft_data)
    assert isinstance(raft_data, tuple)
    return _Head(raft_bytes, raft_data, index, first, _read_pointer(tar, file_name, index))


def _fsync_tree(root: Path) -> dict[str, int]:
    """fsync every file and directory under ``root``; return each file's size by relative name."""
    sizes: dict[str, int] = {}
    for relative, path in _state_files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            sizes[relative] = os.fstat(fd).st_size
        finally:
            os.close(fd)
    for directory, _subdirs, _files in os.walk(root):
        _fsync_directory(Path(directory))
    return sizes


class PackState(enum.Enum):
    """Progress of a background snapshot, as reported to pysyncobj's ``serializeChecker``."""

    IDLE = "idle"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # reported once; the new file is in place
    FAILED = "failed"  # reported once


class SerializingInBackground(Exception):
    """Raised by :meth:`SnapshotCodec.write` in background mode: pysyncobj then skips renaming its
    temporary file and waits for the ``serializeChecker`` (pinned in ``_patches``)."""


class SnapshotCodec:
    """pysyncobj's custom ``serializer(file_name, raft_data)``, ``deserializer(file_name)`` and (in
    background mode) ``serializeChecker``, all called on the replication thread, and the opener of
    the dump for a transmission.

    ``write`` takes the state machine's snapshot on the calling thread (the consistent point: the
    state at the last applied index) into a checkpoint directory and, in background mode, fsyncs it
    and writes the local dump in a separate thread so a large store does not stall heartbeats;
    :meth:`poll` moves the finished file to ``dump_path`` on the replication thread (never over a
    snapshot installed meanwhile). ``work_dir`` holds temporary files only and is emptied by the
    constructor; ``checkpoints_dir`` (default: ``snapshots`` beside ``dump_path``, same file system
    as the store so that checkpoints are hard links) holds the kept checkpoints. pysyncobj logs and
    swallows a deserializer error and carries on (it would even acknowledge the snapshot to the
    leader), so ``on_restore_failure`` is called first: the node must stop rather than run without
    the state it was sent.
    """

    def __init__(self, state_machine: StateMachine, work_dir: Path, dump_path: Path, *,
                 checkpoints_dir: Path | None = None, background: bool = True,
                 on_restore_failure: Callable[[BaseException], None] | None = None,
                 write_latency: LatencyTally | None = None, restore_latency: LatencyTally | None = None,
                 take_latency: LatencyTally | None = None) -> None:
        """``write_latency`` / ``restore_latency``: where the durations of snapshots written (taken
        and made durable) and restored are observed (metrics), if given; ``take_latency``: where the
        time the calling (replication) thread spends taking the state machine's snapshot is."""
        self._state_machine = state_machine
        self._work_dir = work_dir
        self._dump_path = dump_path
        self._checkpoints_dir = checkpoints_dir or dump_path.parent / CHECKPOINTS_DIR_NAME
        self._background = background
        self._on_restore_failure = on_restore_failure
        self._job: threading.Thread | None = None
        self._job_target: Path | None = None
        self._job_checkpoint: str | None = None
        self._job_error: BaseException | None = None
        self._job_restores = 0
        self._restores = 0  # snapshots restored or installed since start
        self._unreported: PackState | None = None
        self._write_latency = write_latency
        self._restore_latency = restore_latency
        self._take_latency = take_latency
        shutil.rmtree(work_dir, ignore_errors=True)
        work_dir.mkdir(parents=True)
        self._checkpoints_dir.mkdir(parents=True, exist_ok=True)
        self._prune_to_dump()

    # -- kept checkpoints --------------------------------------------------------------------------
    def _prune_to_dump(self) -> None:
        """Delete every kept checkpoint but the one the dump in place names (all: no dump, or a full one)."""
        keep = None
        if self._dump_path.exists():
            file_name = str(self._dump_path)
            try:
                with tarfile.open(file_name, mode="r:") as tar:
                    pointer = _head(tar, file_name).pointer
            except (OSError, tarfile.TarError, SnapshotError, pickle.UnpicklingError) as exc:
                logger.warning("not deleting old snapshot checkpoints: the snapshot file is unreadable (%s)", exc)
                return
            keep = None if pointer is None else pointer[0]
        self._prune_checkpoints(keep)

    def _prune_checkpoints(self, keep: str | None) -> None:
        """Delete every kept checkpoint but ``keep``."""
        for path in self._checkpoints_dir.iterdir():
            if path.name != keep and _CHECKPOINT_DIR_RE.fullmatch(path.name):
                shutil.rmtree(path, ignore_errors=True)

    def checkpoint_names(self) -> list[str]:
        """The kept checkpoint directories (for tests and operators)."""
        return sorted(p.name for p in self._checkpoints_dir.iterdir() if _CHECKPOINT_DIR_RE.fullmatch(p.name))

    def _keep(self, scratch: Path, name: str, raft_data: object, target: Path) -> None:
        """Make the checkpoint in ``scratch`` durable as ``checkpoints_dir/name``; write the local
        dump naming it into ``target`` (fsynced)."""
        sizes = _fsync_tree(scratch)
        kept = self._checkpoints_dir / name
        os.rename(scratch, kept)
        _fsync_directory(self._checkpoints_dir)
        _write_local_dump(target, raft_data, name, sizes)

    # -- pysyncobj's serializer ----------------------------------------------------------------------
    def write(self, file_name: str, raft_data: object) -> None:
        """Snapshot the state machine with ``raft_data`` into ``file_name`` (synchronous mode) or
        start making it durable in a thread and raise :class:`SerializingInBackground`."""
        started = time.monotonic()
        try:
            assert self._job is None, "pysyncobj serializes one snapshot at a time"
            index = snapshot_index(raft_data)
            self._prune_to_dump()  # (synchronous mode: what an earlier write left)
            name = f"{index}-{time.time_ns()}"
            scratch = self._work_dir / f"checkpoint-{name}"
            try:
                self._state_machine.write_snapshot(str(scratch))
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            self._observe(self._take_latency, started)
            if not self._background:
                try:
                    self._keep(scratch, name, raft_data, Path(file_name))
                except BaseException:
                    shutil.rmtree(scratch, ignore_errors=True)
                    shutil.rmtree(self._checkpoints_dir / name, ignore_errors=True)
                    raise
                logger.info("wrote snapshot at index %d (checkpoint %s)", index, name)
                self._observe(self._write_latency, started)
                return
            self._job_target = self._work_dir / f"snapshot-{index}.tar"
            self._job_checkpoint = name
            self._job_error = None
            self._job_restores = self._restores
            self._job = threading.Thread(target=self._keep_job, args=(scratch, name, raft_data, self._job_target,
                                                                      started),
                                         name=f"raft-snapshot-{index}", daemon=True)
            self._job.start()
        except Exception:
            # pysyncobj swallows serializer errors without a trace; keep one.
            logger.exception("writing snapshot %s failed", file_name)
            if self._background:
                self._unreported = PackState.FAILED  # pysyncobj waits for the checker to say so
            raise
        raise SerializingInBackground(index)

    @staticmethod
    def _observe(tally: LatencyTally | None, started: float) -> None:
        if tally is not None:
            tally.observe(time.monotonic() - started)

    def _keep_job(self, scratch: Path, name: str, raft_data: object, target: Path, started: float) -> None:
        try:
            self._keep(scratch, name, raft_data, target)
            logger.info("wrote snapshot at index %d (checkpoint %s)", snapshot_index(raft_data), name)
            self._observe(self._write_latency, started)
        except BaseException as exc:
            logger.exception("writing snapshot %s failed", target)
            self._job_error = exc
            shutil.rmtree(scratch, ignore_errors=True)

    def poll(self) -> PackState:
        """Background progress; on completion moves the file into place (replication thread only)."""
        if self._unreported is not None:
            state, self._unreported = self._unreported, None
            return state
        job, target, name = self._job, self._job_target, self._job_checkpoint
        if job is None or target is None or name is None:
            return PackState.IDLE
        if job.is_alive():
            return PackState.RUNNING
        self._job = self._job_target = self._job_checkpoint = None
        if self._job_error is not None or self._restores != self._job_restores:
            if self._job_error is None:
                logger.info("discarding snapshot %s: a newer one was installed meanwhile", target.name)
            target.unlink(missing_ok=True)
            shutil.rmtree(self._checkpoints_dir / name, ignore_errors=True)
            return PackState.FAILED
        os.replace(target, self._dump_path)
        _fsync_directory(self._dump_path.parent)
        self._prune_checkpoints(keep=name)
        return PackState.SUCCEEDED

    def close(self, timeout_s: float) -> None:
        """Wait (bounded) for a background job to finish."""
        job = self._job
        if job is not None:
            job.join(timeout_s)

    # -- transmissions -------------------------------------------------------------------------------
    def open_for_transmission(self, file_name: str) -> BinaryIO | TransmissionReader:
        """What pysyncobj reads to send the dump ``file_name`` to a follower: always a full snapshot."""
        with tarfile.open(file_name, mode="r:") as tar:
            head = _head(tar, file_name)
        if head.pointer is None:
            return open(file_name, "rb")  # noqa: SIM115 (pysyncobj reads it to the end)
        name, sizes = head.pointer
        files = _open_files(self._checkpoints_dir / name, sizes)
        logger.info("sending snapshot at index %d from checkpoint %s (%d files)", head.at_index, name, len(files))
        return TransmissionReader(_full_tar(head.raft_bytes, head.at_index, files), files)

    # -- pysyncobj's deserializer --------------------------------------------------------------------
    def read(self, file_name: str) -> tuple[object, ...]:
        """Restore the state machine from ``file_name`` unless it is already at or past the snapshot's
        index; return the snapshot's ``raft_data``."""
        try:
            head = self._read(file_name)
        except Exception as exc:
            logger.critical("restoring snapshot %s failed", file_name, exc_info=True)
            if self._on_restore_failure is not None:
                self._on_restore_failure(exc)
            raise
        if Path(file_name) == self._dump_path:  # as pysyncobj calls it: the dump in place was just read
            self._prune_checkpoints(keep=None if head.pointer is None else head.pointer[0])
        else:
            self._prune_to_dump()
        return head.raft_data

    def _read(self, file_name: str) -> _Head:
        self._restores += 1
        with tarfile.open(file_name, mode="r:") as tar:
            head = _head(tar, file_name)
            index, pointer = head.at_index, head.pointer
            applied = self._state_machine.applied_index()
            if pointer is not None:
                # a local dump: its checkpoint must be there even when the state is ahead (it is sent)
                _close_all(_open_files(self._checkpoints_dir / pointer[0], pointer[1]))
            if applied >= index:
                logger.info("state machine at %d is at or past snapshot %d: keeping it", applied, index)
                return head
            scratch = self._work_dir / f"read-{index}"
            shutil.rmtree(scratch, ignore_errors=True)
            started = time.monotonic()
            try:
                state_dir = scratch / "state"
                if pointer is None:
                    state_dir.mkdir(parents=True)
                    self._extract_state(tar, head.first, state_dir, index)
                else:  # the restore consumes its directory: restore from a copy
                    scratch.mkdir(parents=True)
                    shutil.copytree(self._checkpoints_dir / pointer[0], state_dir)
                self._state_machine.restore_snapshot(str(state_dir), index)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            self._observe(self._restore_latency, started)
        logger.info("restored state machine from snapshot at index %d", index)
        return head

    def _extract_state(self, tar: tarfile.TarFile, first: tarfile.TarInfo, state_dir: Path, index: int) -> None:
        seen: dict[str, list[int]] = {}
        manifest: dict[str, object] | None = None
        for member in tar:  # iterates from the first member again
            if member is first:
                continue
            if member.name == MANIFEST_NAME:
                extracted = tar.extractfile(member)
                assert extracted is not None
                manifest = json.loads(extracted.read())
                continue
            if not (member.name.startswith(STATE_PREFIX) and member.isfile()):
                raise SnapshotError(f"unexpected member {member.name!r} ({member.type!r})")
            relative = _safe_relative(member.name[len(STATE_PREFIX):])
            target = state_dir.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            crc32 = 0
            with open(target, "wb") as sink:
                while chunk := source.read(_COPY_CHUNK_BYTES):
                    crc32 = zlib.crc32(chunk, crc32)
                    sink.write(chunk)
            seen[relative.as_posix()] = [member.size, crc32]
        if manifest is None or manifest.get("index") != index:
            raise SnapshotError(f"missing manifest or manifest index != {index}")
        if manifest.get("files") != seen:
            raise SnapshotError("state files do not match the manifest (size or CRC-32)")

