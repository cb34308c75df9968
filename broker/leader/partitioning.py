"""Which partition a record goes to.

Documented, stable rule (the same in every client): an explicit partition wins; else
``crc32c(key) % partitions`` (CRC32C, Castagnoli, of the raw key bytes, as an unsigned 32-bit
integer); else round-robin per topic on the leader.
"""

from __future__ import annotations

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
        self._counters: dict[str, int] = {}

    def next(self, topic: str, partitions: int) -> int:
        return self.claim(topic, 1) % partitions

    def claim(self, topic: str, count: int) -> int:
        """Reserve ``count`` consecutive turns; returns the first (take it modulo the partitions)."""
        with self._lock:
            first = self._counters.get(topic, 0)
            self._counters[topic] = first + count
            return first
