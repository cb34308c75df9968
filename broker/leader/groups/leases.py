"""The lease table of one group: which records are in flight, to which stream, until when.

Leases live only in the leader's memory (SPEC §3.2): a failover forgets them, and the new leader
delivers every unsettled record again (at-least-once). Being leader-local, lease deadlines (and
member sessions) are measured on the node clock's monotonic reading (``Clock.monotonic_ms``,
:mod:`broker.clock`), never on the wall clock: a leader clock that jumps must not make a lease wait
for the size of the jump. Not thread-safe: the
owning :class:`~broker.leader.groups.runtime.GroupRuntime` serializes access under its lock.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

Position = tuple[int, int]  # (partition, offset)


@dataclass
class Lease:
    """One delivered record not settled yet."""

    partition: int
    offset: int
    stream_id: int
    member_id: str
    deadline_ms: int  # on the lease clock (monotonic in production), not the wall clock
    attempt: int  # 1 for the first delivery
    key: bytes | None  # the record key (ordered groups block it while leased)
    expiring: bool = False  # an EXPIRE for it is being replicated

    @property
    def position(self) -> Position:
        return self.partition, self.offset


class LeaseTable:
    """Leases by position, with counts per stream, per partition and per key."""

    def __init__(self) -> None:
        self._leases: dict[Position, Lease] = {}
        self._per_stream: collections.Counter[int] = collections.Counter()
        self._per_partition: collections.Counter[int] = collections.Counter()
        self._keys: collections.Counter[bytes] = collections.Counter()

    def __len__(self) -> int:
        return len(self._leases)

    def get(self, position: Position) -> Lease | None:
        return self._leases.get(position)

    def add(self, lease: Lease) -> None:
        assert lease.position not in self._leases, f"{lease.position} is leased already"
        self._leases[lease.position] = lease
        self._per_stream[lease.stream_id] += 1
        self._per_partition[lease.partition] += 1
        if lease.key is not None:
            self._keys[lease.key] += 1

    def remove(self, position: Position) -> Lease | None:
        lease = self._leases.pop(position, None)
        if lease is None:
            return None
        for counter, name in ((self._per_stream, lease.stream_id), (self._per_partition, lease.partition)):
            counter[name] -= 1
            if counter[name] <= 0:
                del counter[name]
        if lease.key is not None:
            self._keys[lease.key] -= 1
            if self._keys[lease.key] <= 0:
                del self._keys[lease.key]
        return lease

    def held_by(self, stream_id: int) -> int:
        return self._per_stream.get(stream_id, 0)

    def in_partition(self, partition: int) -> int:
        return self._per_partition.get(partition, 0)

    def key_leased(self, key: bytes) -> bool:
        return key in self._keys

    def expired(self, now_ms: int) -> list[Lease]:
        """Leases past their deadline that are not being expired already."""
        return [lease for lease in self._leases.values() if lease.deadline_ms <= now_ms and not lease.expiring]

    def next_deadline_ms(self) -> int | None:
        deadlines = [lease.deadline_ms for lease in self._leases.values() if not lease.expiring]
        return min(deadlines) if deadlines else None

    def of_partition(self, partition: int) -> list[Lease]:
        return [lease for lease in self._leases.values() if lease.partition == partition]

    def of_member(self, member_id: str) -> list[Lease]:
        return [lease for lease in self._leases.values() if lease.member_id == member_id]

    def all(self) -> list[Lease]:
        return list(self._leases.values())
