"""`ephemeral` topics (SPEC §2.1): leader-only fan-out, never replicated, never stored.

Each partition keeps a bounded ring of its latest records in the leader's memory; a subscriber
that falls further behind than the ring gets a ``GAP`` event and continues at the oldest record
still held. A ring holds at most ``capacity`` records, and all rings together at most ``bytes_max``
bytes of bodies (the node's ``max_ephemeral_bytes``): without it, 10,000 records of 1 MiB per
partition were 10 GiB of the leader's memory, each new leader's in turn. Past the budget the
oldest records go, from the ring being appended to while it holds at least its share (the
average), else from the largest ring, so one busy partition cannot empty the quiet ones.

Offsets start at ``term << 32`` when a node becomes leader (so they never go back
across leader changes) and are contiguous within one leadership.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_RING_RECORDS = 10_000
DEFAULT_BYTES_MAX = 256 << 20


@dataclass(frozen=True, slots=True)
class EphemeralRecord:
    offset: int
    timestamp_ms: int
    body: bytes


class _Ring:
    def __init__(self, base: int, capacity: int) -> None:
        self.records: deque[EphemeralRecord] = deque(maxlen=capacity)
        self.next_offset = base
        self.bytes = 0

    @property
    def start_offset(self) -> int:
        return self.records[0].offset if self.records else self.next_offset


class EphemeralHub:
    """The rings of every ephemeral partition on this node (meaningful on the leader only)."""

    def __init__(self, on_publish: Callable[[], None], capacity: int = DEFAULT_RING_RECORDS,
                 bytes_max: int = DEFAULT_BYTES_MAX) -> None:
        assert capacity > 0 and bytes_max > 0
        self._lock = threading.Lock()
        self._rings: dict[tuple[int, int], _Ring] = {}
        self._term = -1
        self._capacity = capacity
        self._bytes_max = bytes_max
        self._bytes = 0  # every ring's bytes
        self._on_publish = on_publish

    @property
    def term(self) -> int:
        """The leadership the rings belong to (-1 before the first)."""
        return self._term

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def _drop_oldest(self, ring: _Ring) -> None:
        self._bytes -= len(ring.records[0].body)
        ring.bytes -= len(ring.records.popleft().body)

    def _keep_budget(self, appended: _Ring) -> None:
        """Drop oldest records until every ring together fits ``bytes_max`` (see the module)."""
        while self._bytes > self._bytes_max:
            victim = appended
            if appended.bytes * len(self._rings) < self._bytes:  # below its share: take from the largest
                victim = max(self._rings.values(), key=lambda r: r.bytes)
            if victim is appended and len(victim.records) <= 1:
                return  # the record just appended stays, alone, whatever its size
            self._drop_oldest(victim)

    def _ring(self, topic_id: int, partition: int) -> _Ring:
        ring = self._rings.get((topic_id, partition))
        if ring is None:
            ring = self._rings[(topic_id, partition)] = _Ring(max(self._term, 0) << 32, self._capacity)
        return ring

    def publish(self, topic_id: int, term: int, partitions: list[int], bodies: list[bytes],
                now_ms: int) -> list[tuple[int, int, int, bool]]:
        """Append to the rings; returns (partition, offset, timestamp, duplicate=False) per record.
        Timestamps are ``max(now_ms, the ring's newest)``: they never decrease within a leadership."""
        placements = []
        with self._lock:
            self._enter_term(term)
            for partition, body in zip(partitions, bodies, strict=True):
                ring = self._ring(topic_id, partition)
                if len(ring.records) == ring.records.maxlen:
                    self._drop_oldest(ring)
                ts = max(now_ms, ring.records[-1].timestamp_ms) if ring.records else now_ms
                ring.records.append(EphemeralRecord(ring.next_offset, ts, body))
                ring.bytes += len(body)
                self._bytes += len(body)
                self._keep_budget(ring)
                placements.append((partition, ring.next_offset, ts, False))
                ring.next_offset += 1
        self._on_publish()
        return placements

    def enter_term(self, term: int) -> None:
        """This node leads ``term``: a reader on a new leader, before its first publish, finds
        the rings of this leadership (empty, numbered from ``term << 32``), not those of an earlier
        one this node held (which resuming readers would find themselves "past the end" of)."""
        with self._lock:
            self._enter_term(term)

    def let_go(self) -> None:
        """This node stopped leading: its rings serve no one (readers need the leader) and would hold
        up to ``bytes_max`` until it leads again; describe on it then shows empty rings. A node that
        leads again does so in a later term (Raft), whose rings number from that term."""
        with self._lock:
            self._term = -1
            self._rings.clear()
            self._bytes = 0

    def _enter_term(self, term: int) -> None:
        if term != self._term:  # a new leadership: what an old one held is gone
            self._term = term
            self._rings.clear()
            self._bytes = 0

    def bounds(self, topic_id: int, partition: int) -> tuple[int, int, int, int]:
        """(start offset, end offset, records, bytes) held for one partition."""
        with self._lock:
            ring = self._ring(topic_id, partition)
            return ring.start_offset, ring.next_offset, len(ring.records), ring.bytes

    def read(self, topic_id: int, partition: int, offset: int, limit: int) -> list[EphemeralRecord]:
        """Up to ``limit`` records from ``offset``, or from the oldest record held when that is past
        ``offset`` (records dropped since the caller's :meth:`bounds`: the caller compares offsets)."""
        with self._lock:
            ring = self._ring(topic_id, partition)
            if not ring.records or offset >= ring.next_offset:
                return []
            first = max(offset - ring.records[0].offset, 0)
            return [ring.records[i] for i in range(first, min(first + limit, len(ring.records)))]

    def first_at_or_after(self, topic_id: int, partition: int, timestamp_ms: int) -> int:
        with self._lock:
            ring = self._ring(topic_id, partition)
            for rec in ring.records:
                if rec.timestamp_ms >= timestamp_ms:
                    return rec.offset
            return ring.next_offset

    def forget_topic(self, topic_id: int) -> None:
        with self._lock:
            for key in [k for k in self._rings if k[0] == topic_id]:
                self._bytes -= self._rings.pop(key).bytes
