"""A complete in-memory :class:`broker.storage.Store` (sorted keys, atomic batches).

Used by unit tests and as the store for data that must not outlive the process.
"""

from __future__ import annotations

import bisect
import os
import pickle
import threading
from collections.abc import Iterator

from broker.storage import Batch, Column

_Op = tuple[str, Column, bytes, bytes]


class MemoryBatch:
    """Buffered writes for :class:`MemoryStore`."""

    def __init__(self) -> None:
        self.ops: list[_Op] = []

    def put(self, column: Column, key: bytes, value: bytes) -> None:
        self.ops.append(("put", column, key, value))

    def delete(self, column: Column, key: bytes) -> None:
        self.ops.append(("del", column, key, b""))

    def delete_range(self, column: Column, begin: bytes, end: bytes) -> None:
        self.ops.append(("range", column, begin, end))


class _SortedColumn:
    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.values: dict[bytes, bytes] = {}

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self.values:
            bisect.insort(self.keys, key)
        self.values[key] = value

    def delete(self, key: bytes) -> None:
        if self.values.pop(key, None) is not None:
            del self.keys[bisect.bisect_left(self.keys, key)]

    def delete_range(self, begin: bytes, end: bytes) -> None:
        lo, hi = bisect.bisect_left(self.keys, begin), bisect.bisect_left(self.keys, end)
        for key in self.keys[lo:hi]:
            del self.values[key]
        del self.keys[lo:hi]


class MemoryStore:
    """An ordered in-memory store; a lock makes every batch atomic to readers."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._columns: dict[Column, _SortedColumn] = {}
        self.clear()

    def batch(self) -> MemoryBatch:
        return MemoryBatch()

    def write(self, batch: Batch, *, sync: bool = False, wal: bool = True) -> None:
        assert isinstance(batch, MemoryBatch), "a batch from another store"
        with self._lock:
            for op, column, a, b in batch.ops:
                col = self._columns[column]
                if op == "put":
                    col.put(a, b)
                elif op == "del":
                    col.delete(a)
                else:
                    col.delete_range(a, b)

    def get(self, column: Column, key: bytes) -> bytes | None:
        with self._lock:
            return self._columns[column].values.get(key)

    def get_many(self, column: Column, keys: list[bytes]) -> list[bytes | None]:
        with self._lock:
            values = self._columns[column].values
            return [values.get(k) for k in keys]

    def scan(self, column: Column, begin: bytes, end: bytes, limit: int | None = None) -> Iterator[
        tuple[bytes, bytes]
    ]:
        with self._lock:
            col = self._columns[column]
            lo, hi = bisect.bisect_left(col.keys, begin), bisect.bisect_left(col.keys, end)
            if limit is not None:
                hi = min(hi, lo + limit)
            items = [(k, col.values[k]) for k in col.keys[lo:hi]]
        yield from items

    def flush(self) -> None:
        """Nothing to make durable: this store lives in the process."""

    def release_pages(self, column: Column, low: bytes, high: bytes) -> None:
        """Nothing to release: the records are this process's own memory."""

    def size_bytes(self) -> int:
        with self._lock:
            return sum(len(k) + len(v) for c in self._columns.values() for k, v in c.values.items())

    def checkpoint(self, directory: str) -> None:
        os.makedirs(directory)
        with self._lock:
            data = {c.value: dict(col.values) for c, col in self._columns.items()}
        with open(os.path.join(directory, "memory.pickle"), "wb") as f:
            pickle.dump(data, f, protocol=5)

    def replace_with(self, directory: str) -> None:
        with open(os.path.join(directory, "memory.pickle"), "rb") as f:
            data = pickle.load(f)
        columns = {c: _SortedColumn() for c in Column}
        for name, values in data.items():
            col = columns[Column(name)]
            col.values = dict(values)
            col.keys = sorted(values)
        with self._lock:
            self._columns = columns

    def clear(self) -> None:
        with self._lock:
            self._columns = {c: _SortedColumn() for c in Column}

    def close(self) -> None:
        pass
