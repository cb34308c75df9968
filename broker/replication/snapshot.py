"""The single snapshot file pysyncobj stores and ships: a state-machine snapshot plus Raft metadata.

pysyncobj keeps one "full dump" file per node, written at log compaction and streamed to followers
that are too far behind. :class:`SnapshotCodec` provides its ``serializer``/``deserializer`` pair:
the file is an uncompressed tar holding ``raft-data.pickle`` (pysyncobj's ``raftData`` tuple, first
so it can be read without scanning the rest), the directory written by
:meth:`StateMachine.write_snapshot` under ``state/``, and ``manifest.json`` (size and CRC-32 of
every state file, checked on restore). No pysyncobj import is needed here.
"""

from __future__ import annotations

import enum
import io
import json
import logging
import os
import pickle
import shutil
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from broker.replication import StateMachine
from broker.replication.stats import LatencyTally
from broker.replication.transport import restricted_loads

logger = logging.getLogger(__name__)

RAFT_DATA_NAME = "raft-data.pickle"
MANIFEST_NAME = "manifest.json"
STATE_PREFIX = "state/"
_COPY_CHUNK_BYTES = 1 << 20


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


def read_raft_data(file_name: str) -> tuple[object, ...]:
    """The ``raftData`` tuple of the snapshot file ``file_name`` (its first tar member), read without
    restoring anything: lets a follower compare a received snapshot with its own log first."""
    with tarfile.open(file_name, mode="r:") as tar:
        first = tar.next()
        if first is None or first.name != RAFT_DATA_NAME:
            raise SnapshotError(f"{file_name}: first member must be {RAFT_DATA_NAME}")
        extracted = tar.extractfile(first)
        assert extracted is not None
        raft_data = pickle.loads(extracted.read())
    snapshot_index(raft_data)  # validates the shape
    assert isinstance(raft_data, tuple)
    return raft_data


class _Crc32Reader:
    """A read-only file wrapper that computes the CRC-32 of what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.crc32 = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.crc32 = zlib.crc32(data, self.crc32)
        return data


def _state_files(root: Path) -> Iterator[tuple[str, Path]]:
    for directory, _subdirs, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = Path(directory) / name
            yield path.relative_to(root).as_posix(), path


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _safe_relative(name: str) -> PurePosixPath:
    relative = PurePosixPath(name[len(STATE_PREFIX) :])
    if relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise SnapshotError(f"unsafe path in snapshot: {name!r}")
    return relative


class PackState(enum.Enum):
    """Progress of a background snapshot, as reported to pysyncobj's ``serializeChecker``."""

    IDLE = "idle"
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # reported once; the new file is in place
    FAILED = "failed"  # reported once


class SerializingInBackground(Exception):
    """Raised by :meth:`SnapshotCodec.write` in background mode: pysyncobj then skips renaming its
    temporary file and waits for the ``serializeChecker`` (pinned in ``_patches``)."""


def pack(state_dir: Path, raft_data: object, target: Path) -> int:
    """Write ``raft_data`` and every file under ``state_dir`` into the tar ``target`` (fsynced);
    return the number of state files."""
    index = snapshot_index(raft_data)
    manifest: dict[str, list[int]] = {}
    with open(target, "wb") as raw, tarfile.open(fileobj=raw, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        tar.copybufsize = _COPY_CHUNK_BYTES  # type: ignore[attr-defined]  # large chunks: the copy and CRC run mostly without the GIL
        _add_bytes(tar, RAFT_DATA_NAME, pickle.dumps(raft_data, protocol=5))
        for relative, path in _state_files(state_dir):
            info = tar.gettarinfo(str(path), arcname=STATE_PREFIX + relative)
            with open(path, "rb") as source:
                reader = _Crc32Reader(source)
                tar.addfile(info, reader)
            manifest[relative] = [info.size, reader.crc32]
        _add_bytes(tar, MANIFEST_NAME, json.dumps({"index": index, "files": manifest}).encode())
        tar.close()
        raw.flush()
        os.fsync(raw.fileno())
    return len(manifest)


class SnapshotCodec:
    """pysyncobj's custom ``serializer(file_name, raft_data)``, ``deserializer(file_name)`` and (in
    background mode) ``serializeChecker``, all called on the replication thread.

    ``write`` takes the state machine's snapshot on the calling thread (the consistent point: the
    state at the last applied index) and, in background mode, packs it into the tar in a separate
    thread so a large store does not stall heartbeats; :meth:`poll` moves the finished file to
    ``dump_path`` on the replication thread (never over a snapshot installed meanwhile).
    ``work_dir`` holds temporary files only and is emptied by the constructor. pysyncobj logs and
    swallows a deserializer error and carries on (it would even acknowledge the snapshot to the
    leader), so ``on_restore_failure`` is called first: the node must stop rather than run without
    the state it was sent.
    """

    def __init__(self, state_machine: StateMachine, work_dir: Path, dump_path: Path, *,
                 background: bool = True,
                 on_restore_failure: Callable[[BaseException], None] | None = None,
                 write_latency: LatencyTally | None = None, restore_latency: LatencyTally | None = None) -> None:
        """``write_latency`` / ``restore_latency``: where the durations of snapshots written (taken
        and packed) and restored are observed (metrics), if given."""
        self._state_machine = state_machine
        self._work_dir = work_dir
        self._dump_path = dump_path
        self._background = background
        self._on_restore_failure = on_restore_failure
        self._job: threading.Thread | None = None
        self._job_target: Path | None = None
        self._job_error: BaseException | None = None
        self._job_restores = 0
        self._restores = 0  # snapshots restored or installed since start
        self._unreported: PackState | None = None
        self._write_latency = write_latency
        self._restore_latency = restore_latency
        shutil.rmtree(work_dir, ignore_errors=True)
        work_dir.mkdir(parents=True)

    def write(self, file_name: str, raft_data: object) -> None:
        """Snapshot the state machine with ``raft_data`` into ``file_name`` (synchronous mode) or
        start packing it in a thread and raise :class:`SerializingInBackground`."""
        started = time.monotonic()
        try:
            assert self._job is None, "pysyncobj serializes one snapshot at a time"
            index = snapshot_index(raft_data)
            scratch = self._work_dir / f"write-{index}"
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir()
            try:
                self._state_machine.write_snapshot(str(scratch / "state"))
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            if not self._background:
                try:
                    files = pack(scratch / "state", raft_data, Path(file_name))
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
                logger.info("wrote snapshot at index %d (%d files)", index, files)
                self._observe(self._write_latency, started)
                return
            self._job_target = self._work_dir / f"snapshot-{index}.tar"
            self._job_error = None
            self._job_restores = self._restores
            self._job = threading.Thread(target=self._pack_job, args=(scratch, raft_data, self._job_target, started),
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

    def _pack_job(self, scratch: Path, raft_data: object, target: Path, started: float) -> None:
        try:
            files = pack(scratch / "state", raft_data, target)
            logger.info("packed snapshot at index %d (%d files)", snapshot_index(raft_data), files)
            self._observe(self._write_latency, started)
        except BaseException as exc:
            logger.exception("packing snapshot %s failed", target)
            self._job_error = exc
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def poll(self) -> PackState:
        """Background progress; on completion moves the file into place (replication thread only)."""
        if self._unreported is not None:
            state, self._unreported = self._unreported, None
            return state
        job, target = self._job, self._job_target
        if job is None or target is None:
            return PackState.IDLE
        if job.is_alive():
            return PackState.RUNNING
        self._job = self._job_target = None
        if self._job_error is not None:
            return PackState.FAILED
        if self._restores != self._job_restores:
            logger.info("discarding snapshot %s: a newer one was installed meanwhile", target.name)
            target.unlink(missing_ok=True)
            return PackState.FAILED
        os.replace(target, self._dump_path)
        _fsync_directory(self._dump_path.parent)
        return PackState.SUCCEEDED

    def close(self, timeout_s: float) -> None:
        """Wait (bounded) for a background pack to finish."""
        job = self._job
        if job is not None:
            job.join(timeout_s)

    def read(self, file_name: str) -> tuple[object, ...]:
        """Restore the state machine from ``file_name`` unless it is already at or past the snapshot's
        index; return the snapshot's ``raft_data``."""
        try:
            return self._read(file_name)
        except Exception as exc:
            logger.critical("restoring snapshot %s failed", file_name, exc_info=True)
            if self._on_restore_failure is not None:
                self._on_restore_failure(exc)
            raise

    def _read(self, file_name: str) -> tuple[object, ...]:
        self._restores += 1
        with tarfile.open(file_name, mode="r:") as tar:
            first = tar.next()
            if first is None or first.name != RAFT_DATA_NAME:
                raise SnapshotError(f"{file_name}: first member must be {RAFT_DATA_NAME}")
            extracted = tar.extractfile(first)
            assert extracted is not None
            raft_data = restricted_loads(extracted.read())  # it may come from a peer: no globals but TCPNode
            index = snapshot_index(raft_data)
            applied = self._state_machine.applied_index()
            if applied >= index:
                logger.info("state machine at %d is at or past snapshot %d: keeping it", applied, index)
                return raft_data
            scratch = self._work_dir / f"read-{index}"
            shutil.rmtree(scratch, ignore_errors=True)
            started = time.monotonic()
            try:
                state_dir = scratch / "state"
                state_dir.mkdir(parents=True)
                self._extract_state(tar, first, state_dir, index)
                self._state_machine.restore_snapshot(str(state_dir), index)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            self._observe(self._restore_latency, started)
        logger.info("restored state machine from snapshot at index %d", index)
        return raft_data

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
            relative = _safe_relative(member.name)
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
