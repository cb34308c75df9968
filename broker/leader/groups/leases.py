"""The lease table of one group: which records are in flight, to which stream, until when.

Leases live only in the leader's memory (SPEC §3.2): a failover forgets them, and the new leader
delivers every unsettled record again (at-least-once). Being leader-local, lease deadlines (and
member sessions) are measured on the node clock's monotonic reading (``Clock.monotonic_ms``,
:mod:`broker.clock`), never on the wall clock: a leader clock that jumps must not make a lease wait
for the size of the jump. Not thread-safe: the
owning :class:`~broker.leader.groups.runtime.GroupRuntime` serializes access under its lock.

The group ticker asks for the expired leases every ``TICK_S`` (50 ms), and a group may hold up to
``max_pending`` (at most 100,000) of them, so finding them must not walk the table: a walk of
100,000 leases took 2.8-4.4 ms under the group's lock on every tick, 8 % of a core for a leader
doing nothing else (bench/NOTE.md, 2026-12-06). The
deadlines sit in a heap of ``(deadline_ms, partition, offset)``, lazy: a lease removed, expired
already or given a new deadline leaves its old item behind, recognised as stale when popped (the
lease is gone, is being expired, or has another deadline) and dropped. Once the heap holds more
than twice the leases plus ``STALE_SLACK`` items, it is rebuilt from the leases. A deadline changes
only through :meth:`LeaseTable.set_deadline` and a lease's ``expiring`` only through
:meth:`LeaseTable.take_expired` and :meth:`LeaseTable.unexpire`, which keep the heap true. The
leases of each partition are indexed too: a partition being handed over is checked on every tick.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

Position = tuple[int, int]  # (partition, offset)
STALE_SLACK = 1024  # stale heap items tolerated beyond the leases held, before a rebuild


@dataclass
class Lease:
    """One delivered record not settled yet."""

    partition: int
    offset: int
    stream_id: int
    member_id: str
    deadline_ms: int  # on the lease clock (monotonic in production), not the wall clock; see set_deadline
    attempt: int  # 1 for the first delivery
    key: bytes | None  # the record key (ordered groups block it while leased)
    expiring: bool = False  # an EXPIRE for it is being replicated; see take_expired
    # (watermark, first retained offset) of the SKIP_FORWARD its stream was sent before this lease:
    # the client's settle of it proves the event arrived (GroupRuntime.confirm_told)
    after_skip: tuple[int, int] | None = None
    # the delivery's number, in the position token the record was handed out with (0: a version-1
    # token, from a cluster whose format predates delivery tokens); see broker.core.records
    delivery: int = 0

    @property
    def position(self) -> Position:
        return self.partition, self.offset


class LeaseTable:
    """Leases by position, with counts per stream and key, the leases of each partition, and a heap
    of deadlines (see the module)."""

    def __init__(self) -> None:
        self._leases: dict[Position, Lease] = {}
        self._per_stream: dict[int, int] = {}
        self._keys: dict[bytes, int] = {}
        self._by_partition: dict[int, dict[Position, Lease]] = {}
        self._deadlines: list[tuple[int, int, int]] = []  # (deadline_ms, partition, offset), lazy

    def __len__(self) -> int:
        return len(self._leases)

    def get(self, position: Position) -> Lease | None:
        return self._leases.get(position)

    def add(self, lease: Lease) -> None:
        position = lease.position
        assert position not in self._leases, f"{position} is leased already"
        self._leases[position] = lease
        self._per_stream[lease.stream_id] = self._per_stream.get(lease.stream_id, 0) + 1
        self._by_partition.setdefault(lease.partition, {})[position] = lease
        if lease.key is not None:
            self._keys[lease.key] = self._keys.get(lease.key, 0) + 1
        if not lease.expiring:
            self._push(lease)

    def remove(self, position: Position) -> Lease | None:
        lease = self._leases.pop(position, None)
        if lease is None:
            return None
        held = self._per_stream[lease.stream_id] - 1
        if held:
            self._per_stream[lease.stream_id] = held
        else:
            del self._per_stream[lease.stream_id]
        in_partition = self._by_partition[lease.partition]
        del in_partition[position]
        if not in_partition:
            del self._by_partition[lease.partition]
        if lease.key is not None:
            left = self._keys[lease.key] - 1
            if left:
                self._keys[lease.key] = left
            else:
                del self._keys[lease.key]
        return lease  # its heap item, if any, is stale now

    def held_by(self, stream_id: int) -> int:
        return self._per_stream.get(stream_id, 0)

    def in_partition(self, partition: int) -> int:
        return len(self._by_partition.get(partition, ()))

    def key_leased(self, key: bytes) -> bool:
        return key in self._keys

    def set_deadline(self, lease: Lease, deadline_ms: int) -> None:
        """A held lease (not expiring) ends at ``deadline_ms`` instead."""
        assert self._leases.get(lease.position) is lease and not lease.expiring
        lease.deadline_ms = deadline_ms
        self._push(lease)

    def take_expired(self, now_ms: int) -> list[Lease]:
        """Leases whose deadline is at or before ``now_ms`` and that are not being expired already,
        marked as being expired (in deadline order)."""
        heap, leases = self._deadlines, self._leases
        out: list[Lease] = []
        while heap and heap[0][0] <= now_ms:
            deadline, p, o = heapq.heappop(heap)
            lease = leases.get((p, o))
            if lease is None or lease.expiring or lease.deadline_ms != deadline:
                continue  # stale: settled, taken already (a second item of the same deadline), or moved
            lease.expiring = True
            out.append(lease)
        return out

    def unexpire(self, leases: list[Lease]) -> None:
        """Their EXPIRE could not be replicated: the ones still held are due again at the next
        :meth:`take_expired`."""
        for lease in leases:
            if lease.expiring and self._leases.get(lease.position) is lease:
                lease.expiring = False
                self._push(lease)

    def of_partition(self, partition: int) -> list[Lease]:
        return list(self._by_partition.get(partition, {}).values())

    def of_member(self, member_id: str) -> list[Lease]:
        """A walk of every lease: only a member's leaving or its session's end asks."""
        return [lease for lease in self._leases.values() if lease.member_id == member_id]

    def all(self) -> list[Lease]:
        return list(self._leases.values())

    def heap_items(self) -> int:
        """Items in the deadline heap, stale ones included: right after a push at most twice the
        leases held plus ``STALE_SLACK`` and one; the items of leases gone since leave as their
        deadlines pass."""
        return len(self._deadlines)

    def _push(self, lease: Lease) -> None:
        """``lease`` (held, not expiring) ends at its ``deadline_ms``: into the heap, or the heap rebuilt
        from the leases held (``lease`` among them) once stale items have piled up."""
        heap = self._deadlines
        if len(heap) < 2 * len(self._leases) + STALE_SLACK:
            heapq.heappush(heap, (lease.deadline_ms, lease.partition, lease.offset))
            return
        heap[:] = [(x.deadline_ms, x.partition, x.offset) for x in self._leases.values() if not x.expiring]
        heapq.heapify(heap)
