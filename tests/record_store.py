"""Test helpers that reach under ``broker.core.record_log``: write the old per-record format and
damage stored batches byte by byte (they parse the format on their own, from its docstring)."""

from __future__ import annotations

import struct

from broker.core import records
from broker.storage import Batch, Column, Store

_HEAD = struct.Struct(">BIQ")


def put_format1(batch: Batch, tid: int, partition: int, offset: int, timestamp_ms: int, body: bytes) -> None:
    """One record as the code before format 2 stored it: its own value, a 13-byte frame + body."""
    key = records.record_key(tid, partition, offset)
    batch.put(Column.RECORDS, key, records.frame(key, timestamp_ms, body))


def _holding(store: Store, tid: int, partition: int, offset: int) -> tuple[bytes, bytes]:
    """The stored (key, value) whose batch holds ``offset``."""
    begin, end = records.record_key(tid, partition, offset), records.record_key(tid, partition + 1, 0)
    [(key, value)] = list(store.scan(Column.RECORDS, begin, end, 1))
    fmt, count, first = _HEAD.unpack_from(value)
    assert fmt in (2, 3) and first <= offset < first + count, f"offset {offset} is not in the batch at {first}+{count}"
    return key, value


def _base(value: bytes) -> int:
    """Where the first frame (format 2) or element (format 3) of a stored batch starts."""
    fmt, count, _ = _HEAD.unpack_from(value)
    if fmt == 2:
        return _HEAD.size + 4 * count + 4
    runs = struct.unpack_from(">I", value, _HEAD.size + 8 * count)[0]
    return _HEAD.size + 8 * count + 4 + 12 * runs + 8


def frame_span(value: bytes, index: int) -> tuple[int, int]:
    """Where the frame (format 2) or element (format 3) of the ``index``-th record of a stored batch
    lies in ``value``: its body is its last bytes either way."""
    count = _HEAD.unpack_from(value)[1]
    ends = struct.unpack_from(f">{count}I", value, _HEAD.size)
    base = _base(value)
    return base + (ends[index - 1] if index else 0), base + ends[index]


def value_format(store: Store, tid: int, partition: int, offset: int) -> int:
    """The format byte of the stored value holding ``offset``."""
    return _HEAD.unpack_from(_holding(store, tid, partition, offset)[1])[0]


def flip_record_byte(store: Store, tid: int, partition: int, offset: int) -> None:
    """Flip one bit in the last body byte of the record at ``offset`` (its neighbours untouched)."""
    key, value = _holding(store, tid, partition, offset)
    first = _HEAD.unpack_from(value)[2]
    _, stop = frame_span(value, offset - first)
    batch = store.batch()
    batch.put(Column.RECORDS, key, value[:stop - 1] + bytes([value[stop - 1] ^ 0x40]) + value[stop:])
    store.write(batch, sync=True)


def damage_table(store: Store, tid: int, partition: int, offset: int) -> None:
    """Flip one bit in the offsets table of the batch holding ``offset``."""
    key, value = _holding(store, tid, partition, offset)
    at = _HEAD.size + 1
    batch = store.batch()
    batch.put(Column.RECORDS, key, value[:at] + bytes([value[at] ^ 0x01]) + value[at + 1:])
    store.write(batch, sync=True)


def stored_values(store: Store, tid: int, partition: int) -> list[tuple[int, int]]:
    """(first offset, count) of every stored value of a partition, in order."""
    begin, end = records.record_key(tid, partition, 0), records.record_key(tid, partition + 1, 0)
    out = []
    for _, value in store.scan(Column.RECORDS, begin, end):
        _, count, first = _HEAD.unpack_from(value)
        out.append((first, count))
    return out
