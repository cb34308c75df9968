"""Which partition a record goes to.

Documented, stable rule (the same in every client): an explicit partition wins; else
``crc32c(key) % partitions`` (CRC32C, Castagnoli, of the raw key bytes, as an unsigned 32-bit
integer); else round-robin per topic on the leader.
"""

from __future__ import annotations

import itertools
import threading

import google_crc32c


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a keyed record without an explicit partition."""
    assert partitions > 0
    return int(google_crc32c.value(key)) % partitions


class RoundRobin:
    """Per-topic round-robin counters for records with neither partition nor key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, itertools.count[int]] = {}

    def next(self, topic: str, partitions: int) -> int:
        with self._lock:
            counter = self._counters.setdefault(topic, itertools.count())
            return next(counter) % partitions
