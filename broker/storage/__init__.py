"""Storage seam: an ordered key-value store with column families, atomic batches and checkpoints.

Only ``broker.storage.rocks`` imports rocksdict; ``broker.storage.memory`` is a complete in-memory
implementation used by unit tests and by the ``memory`` durability class.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from typing import Protocol


class ApplyHalt(Exception):
    """The state machine must not go on: the node halts before the command, writing nothing of it
    (the replicator stops applying; a restart resumes from the same index)."""


class StorageFailure(ApplyHalt):
    """The store could not read or write (I/O error, closed database). The caller cannot know what
    was written, so the state machine stops on it instead of carrying on (it would diverge)."""


class StoreCorruption(StorageFailure):
    """The store holds data it cannot read back (a damaged file); the message names the file and what
    to do. Raised by reads that meet a damaged block and by opening a store whose files are damaged.
    A reader turns it into DATA_LOSS (another node may serve the data); the state machine stops on it
    like on any storage failure."""


class Column(enum.StrEnum):
    """Column families. Keys inside each are big-endian so range scans are seeks."""

    META = "meta"  # applied index, counters, topic and partition metadata
    RECORDS = "records"  # (topic_id, partition, offset) -> framed record
    DEDUP = "dedup"  # idempotency keys (and their expiry index) and dedup watermarks
    GROUPS = "groups"  # consumer groups: metadata, cursors, retries, dead letters (core/groups/layout.py)


class Batch(Protocol):
    """An atomic set of writes; nothing is visible until :meth:`Store.write`."""

    def put(self, column: Column, key: bytes, value: bytes) -> None: ...

    def delete(self, column: Column, key: bytes) -> None: ...

    def delete_range(self, column: Column, begin: bytes, end: bytes) -> None:
        """Delete every key in ``[begin, end)``."""
        ...


class Store(Protocol):
    """An ordered byte store. Reads are safe from any thread while one thread writes."""

    def batch(self) -> Batch: ...

    def write(self, batch: Batch, *, sync: bool = False, wal: bool = True) -> None:
        """Apply ``batch`` atomically; with ``sync`` it is on stable storage when this returns.

        ``wal=False`` skips the store's write-ahead log: the write then survives a process crash only
        once the store has flushed it (every :meth:`checkpoint` flushes first, and all column
        families flush together, so a crash leaves the state of one earlier write, never a mix).
        Only for writes the caller can replay after a crash: the state machine's applies, whose
        commands the Raft journal keeps until a checkpoint covering them is durable."""
        ...

    def get(self, column: Column, key: bytes) -> bytes | None: ...

    def get_many(self, column: Column, keys: list[bytes]) -> list[bytes | None]:
        """Several point reads at once (one call into the store)."""
        ...

    def scan(self, column: Column, begin: bytes, end: bytes, limit: int | None = None) -> Iterator[
        tuple[bytes, bytes]
    ]:
        """Keys in ``[begin, end)`` in ascending order, at most ``limit`` of them."""
        ...

    def release_pages(self, column: Column, low: bytes, high: bytes) -> None:
        """A hint, never required: a reader has read every key of ``column`` in ``[low, high)`` and
        will not soon again, so a store may drop them from memory it does not own (the OS page
        cache). Changes nothing a read returns."""
        ...

    def checkpoint(self, directory: str) -> None:
        """Write a consistent copy of the whole store into the new ``directory``."""
        ...

    def flush(self) -> None:
        """Make every write so far durable, written without the write-ahead log too, in one atomic
        step across columns (a crash after it keeps them all)."""
        ...

    def replace_with(self, directory: str) -> None:
        """Replace the whole content with the checkpoint in ``directory`` (consumed)."""
        ...

    def clear(self) -> None:
        """Drop the whole content, durably: the store is then empty."""
        ...

    def size_bytes(self) -> int:
        """Approximate bytes on disk (or in memory)."""
        ...

    def close(self) -> None: ...
