"""A small real StateMachine for the replication tests: a persistent hash chain of applied commands.

Every applied command appends one line ``A <index> <command id> <chain>`` to ``chain.log`` with a
single ``write`` (a kill -9 keeps it; a torn last line is dropped on open); a restored snapshot
appends ``R <index> - <chain>``. The chain is sha256(previous chain, index, command), so two nodes
agree on their whole history iff their chains agree at the same index. Used in-process and by
``node_worker.py``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from broker.replication.snapshot import CHECKPOINTS_DIR_NAME

LOG_NAME = "chain.log"
_GENESIS = "0" * 64


def command_id(command: bytes | memoryview) -> str:
    """The identity of a command in histories (commands in tests are unique)."""
    return hashlib.sha256(command).hexdigest()[:16]


@dataclass(frozen=True)
class Record:
    kind: str  # "A" applied, "R" restored from a snapshot
    index: int
    command_id: str
    chain: str


def read_records(path: Path) -> list[Record]:
    """Every complete record in a chain log (a torn last line is ignored)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    records = []
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is torn or empty
        kind, index, cid, chain = line.decode().split(" ")
        records.append(Record(kind, int(index), cid, chain))
    return records


class ChainStateMachine:
    """Implements ``broker.replication.StateMachine``; idempotent by index, durable against kill -9."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.skipped = 0  # apply calls at or below the applied index (legal: replays)
        self.journal_last_index: int | None = None  # set by journal_opened (None: never called)
        self.apply_delay_s = 0.0  # a slow state machine: each new index takes this long to apply
        self.discarded = False  # discard_state was called (the replicator found it ahead of its log)
        self._open()

    @property
    def log_path(self) -> Path:
        return self._directory / LOG_NAME

    def _open(self) -> None:
        path = self.log_path
        records = read_records(path)
        if path.exists():
            good = sum(len(line) + 1 for line in path.read_bytes().split(b"\n")[:-1])
            os.truncate(path, good)
        self._applied = records[-1].index if records else 0
        self._chain = records[-1].chain if records else _GENESIS
        self.applied_count = sum(1 for r in records if r.kind == "A")
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _append(self, kind: str, index: int, cid: str, chain: str) -> None:
        line = f"{kind} {index} {cid} {chain}\n".encode()
        assert os.write(self._fd, line) == len(line)

    def apply(self, index: int, command: bytes | memoryview) -> object:
        if index <= self._applied:
            self.skipped += 1
            return None
        if self.apply_delay_s:
            time.sleep(self.apply_delay_s)
        chain = hashlib.sha256(bytes.fromhex(self._chain) + index.to_bytes(8, "big") + command).hexdigest()
        self._append("A", index, command_id(command), chain)  # on disk before readers see the index
        self._chain = chain
        self._applied = index
        self.applied_count += 1
        return {"index": index, "chain": chain[:16]}

    def applied_index(self) -> int:
        return self._applied

    def discard_state(self) -> None:
        os.close(self._fd)
        os.truncate(self.log_path, 0)
        self._open()
        self.discarded = True

    def journal_opened(self, last_index: int) -> None:
        self.journal_last_index = last_index  # what the replicator said (tests read it)

    def journal_truncated(self, from_index: int) -> None:
        self.journal_truncated_from = from_index  # what the replicator said (tests may read it)

    def chain(self) -> str:
        return self._chain

    def write_snapshot(self, directory: str) -> None:
        os.mkdir(directory)  # must not exist
        shutil.copyfile(self.log_path, Path(directory) / LOG_NAME)

    def restore_snapshot(self, directory: str, index: int) -> None:
        if self._applied >= index:
            return
        source = Path(directory) / LOG_NAME
        records = read_records(source)
        assert records and records[-1].index <= index, "snapshot content is past its index"
        staged = self._directory / (LOG_NAME + ".restore")
        shutil.copyfile(source, staged)
        with open(staged, "ab") as f:
            f.write(f"R {index} - {records[-1].chain}\n".encode())
            f.flush()
            os.fsync(f.fileno())
        os.close(self._fd)
        os.replace(staged, self.log_path)
        self._open()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def damage_kept_checkpoint(raft_dir: Path) -> Path:
    """Cut the last byte off the chain log in the snapshot checkpoint a replicator keeps under
    ``raft_dir`` (its size no longer matches the snapshot file); return the damaged file."""
    (damaged,) = (raft_dir / CHECKPOINTS_DIR_NAME).glob(f"*/{LOG_NAME}")
    with open(damaged, "r+b") as f:
        f.truncate(damaged.stat().st_size - 1)
    return damaged
