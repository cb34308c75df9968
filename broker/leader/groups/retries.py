"""The retry entries of one group as its leader last read them, indexed by when they fall due.

A stream's pick hands out due retries first, in position order (:mod:`.runtime`). Finding them by
walking every entry made each pick linear in the records waiting: with 5,000 nacked records
waiting out a long backoff, a queue group's fresh records flowed at a third of their rate and cost
the leader 3.5-4.4 times the CPU per message (bench/NOTE.md, 2026-12-06). Here an entry whose
record is not leased sits, per partition, in one of two places:

- *scheduled*: in a heap by ``due_ms`` and, when stored with its delay, in a heap by the time it was
  scheduled at (``due_ms - delay_ms``), latest first. :func:`retry_due_ms` makes an entry due when
  the clock reads ``due_ms`` or later, or earlier than that scheduled time (the clock went back, or
  the forward jump it was stamped under was healed);
- *due*: in a heap of offsets, seen due; a pick :meth:`~RetryIndex.take` s them in offset order.

:meth:`RetryIndex.advance` moves entries from scheduled to due as the clock passes them, popping
only those. The scheduled heaps are lazy: an entry rewritten, leased or made due leaves its old
items behind, recognised when popped (the entry is gone or has another time, is due already, or its
record is leased) and dropped; once stale items outnumber the entries twice over, the heaps are
rebuilt. The due heaps hold exactly the entries marked due. A leased record's entry is in neither
place: the lease's end schedules it again (:meth:`RetryIndex.unleased`), and a pick that took an
entry and did not lease its record gives it back (:meth:`RetryIndex.put_back`).

Not thread-safe: the owning :class:`~broker.leader.groups.runtime.GroupRuntime` holds its lock.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Callable, Iterable

from broker.core.groups.cursor import retry_due_ms
from broker.leader.groups.leases import Position
from broker.v1 import internal_pb2

Leased = Callable[[Position], bool]
STALE_SLACK = 1024  # stale heap items tolerated beyond twice the entries before a rebuild


def _since_key(retry: internal_pb2.RetryState) -> int:
    """The scheduled heap's key of an entry stored with its delay: minus the time it was scheduled
    at, so the heap's top is the latest (the first to fall due when the clock goes back)."""
    return max(retry.delay_ms, 0) - retry.due_ms


class RetryIndex:
    """The group's retry entries (``entries``: by position, as last read; ``keys``: how many wait
    per record key) and which of them are due."""

    def __init__(self) -> None:
        self.entries: dict[Position, internal_pb2.RetryState] = {}
        self.keys: collections.Counter[bytes] = collections.Counter()
        self._at: dict[int, list[tuple[int, int]]] = {}  # partition -> heap of (due_ms, offset)
        self._since: dict[int, list[tuple[int, int]]] = {}  # partition -> heap of (_since_key, offset)
        self._items = 0  # items in _at and _since, stale ones included
        self._due: dict[int, list[int]] = {}  # partition -> heap of offsets: exactly those in _is_due
        self._is_due: set[Position] = set()
        self._latest_due_ms: dict[int, int] = {}  # partition -> the largest due_ms marked due (see _recheck_due)

    @property
    def scheduled_items(self) -> int:
        """Items in the scheduled heaps, stale ones included (bounded: see the module docstring)."""
        return self._items

    # -- what was read ------------------------------------------------------------------------------
    def replace_all(self, entries: dict[Position, internal_pb2.RetryState], leased: Leased) -> None:
        """Every entry of the group, read afresh."""
        self.entries = entries
        self.keys = collections.Counter(r.key for r in entries.values() if r.has_key)
        self._due, self._is_due, self._latest_due_ms = {}, set(), {}
        self._rebuild(leased)

    def update(self, position: Position, retry: internal_pb2.RetryState | None) -> None:
        """``position``'s entry as read now (None: it has none)."""
        old = self.entries.pop(position, None)
        if old is not None and old.has_key:
            self.keys[old.key] -= 1
            if self.keys[old.key] <= 0:
                del self.keys[old.key]
        if position in self._is_due:  # rare: rewritten or removed while due (a commit, a seek, a purge)
            self._is_due.discard(position)
            p, o = position
            heap = self._due[p]
            heap.remove(o)
            heapq.heapify(heap)
        if retry is not None:
            self.entries[position] = retry
            if retry.has_key:
                self.keys[retry.key] += 1
            self._schedule(position, retry)

    # -- leases --------------------------------------------------------------------------------------
    def unleased(self, position: Position) -> None:
        """The lease on ``position``'s record ended: its entry, if it has one, waits again."""
        retry = self.entries.get(position)
        if retry is not None and position not in self._is_due:
            self._schedule(position, retry)

    def take(self, p: int, now_ms: int, count: int, leased: Leased) -> list[tuple[int, internal_pb2.RetryState]]:
        """Up to ``count`` entries of partition ``p`` due at ``now_ms`` whose records are not leased,
        in offset order, taken out of due: the caller leases their records or :meth:`put_back` s
        them."""
        self.advance(p, now_ms, leased)
        heap = self._due.get(p)
        taken: list[tuple[int, internal_pb2.RetryState]] = []
        while heap and len(taken) < count:
            o = heapq.heappop(heap)
            position = (p, o)
            self._is_due.discard(position)
            retry = self.entries[position]
            if leased(position):
                continue  # the lease's end schedules it again
            if retry_due_ms(retry, now_ms) > now_ms:  # the clock went back since it was seen due
                self._schedule(position, retry)
                continue
            taken.append((o, retry))
        if not heap:
            self._latest_due_ms.pop(p, None)
        return taken

    def put_back(self, p: int, offsets: Iterable[int]) -> None:
        """Taken entries whose records were not leased: due as before."""
        for o in offsets:
            self._mark_due(p, o)

    # -- time ----------------------------------------------------------------------------------------
    def advance(self, p: int, now_ms: int, leased: Leased) -> None:
        """Mark partition ``p``'s entries that are due at ``now_ms`` due (the rule of
        :func:`retry_due_ms`)."""
        entries = self.entries
        at = self._at.get(p)
        while at and at[0][0] <= now_ms:
            due_ms, o = heapq.heappop(at)
            self._items -= 1
            if self._current(p, due_ms, o, leased):
                self._mark_due(p, o)
        since = self._since.get(p)
        while since and since[0][0] < -now_ms:  # scheduled at a time later than now
            key, o = heapq.heappop(since)
            self._items -= 1
            retry = entries.get((p, o))
            if (retry is not None and retry.HasField("delay_ms") and _since_key(retry) == key
                    and not leased((p, o))):
                self._mark_due(p, o)
        if self._items > 2 * len(entries) + STALE_SLACK:
            self._rebuild(leased)

    def next_due_ms(self, partitions: Iterable[int], now_ms: int, leased: Leased) -> int | None:
        """The earliest ``due_ms`` after ``now_ms`` among the entries of ``partitions`` not due at
        ``now_ms`` whose records are not leased (None: none waits)."""
        earliest: int | None = None
        for p in partitions:
            self.advance(p, now_ms, leased)
            self._recheck_due(p, now_ms)
            at = self._at.get(p)
            while at and not self._current(p, *at[0], leased):
                heapq.heappop(at)  # stale
                self._items -= 1
            if at and (earliest is None or at[0][0] < earliest):
                earliest = at[0][0]
        return earliest

    # -- inside --------------------------------------------------------------------------------------
    def _recheck_due(self, p: int, now_ms: int) -> None:
        """Schedule again partition ``p``'s entries seen due that are not due at ``now_ms`` (the
        clock went back since). Every entry marked due with ``due_ms <= now_ms`` is due still, so
        the due entries are walked only when the clock reads before the largest ``due_ms`` marked:
        after it went back, or while entries made due by a clock gone back wait to be taken."""
        heap = self._due.get(p)
        if not heap or now_ms >= self._latest_due_ms.get(p, now_ms):
            return
        entries = self.entries
        waiting = {o for o in heap if retry_due_ms(entries[(p, o)], now_ms) > now_ms}
        for o in waiting:
            self._is_due.discard((p, o))
            self._schedule((p, o), entries[(p, o)])
        if waiting:
            heap[:] = [o for o in heap if o not in waiting]
            heapq.heapify(heap)
        if heap:
            self._latest_due_ms[p] = max(entries[(p, o)].due_ms for o in heap)
        else:
            del self._latest_due_ms[p]

    def _current(self, p: int, due_ms: int, o: int, leased: Leased) -> bool:
        """Whether a ``_at`` item ``(due_ms, o)`` of partition ``p`` is its entry's current one: the
        entry is due then, is not marked due already, and its record is not leased."""
        retry = self.entries.get((p, o))
        return retry is not None and retry.due_ms == due_ms and (p, o) not in self._is_due and not leased((p, o))

    def _schedule(self, position: Position, retry: internal_pb2.RetryState) -> None:
        p, o = position
        heapq.heappush(self._at.setdefault(p, []), (retry.due_ms, o))
        self._items += 1
        if retry.HasField("delay_ms"):
            heapq.heappush(self._since.setdefault(p, []), (_since_key(retry), o))
            self._items += 1

    def _mark_due(self, p: int, o: int) -> None:
        position = (p, o)
        retry = self.entries.get(position)
        if retry is not None and position not in self._is_due:
            self._is_due.add(position)
            heapq.heappush(self._due.setdefault(p, []), o)
            if retry.due_ms > self._latest_due_ms.get(p, retry.due_ms - 1):
                self._latest_due_ms[p] = retry.due_ms

    def _rebuild(self, leased: Leased) -> None:
        """The scheduled heaps of the entries neither due nor leased, without stale items."""
        at: dict[int, list[tuple[int, int]]] = {}
        since: dict[int, list[tuple[int, int]]] = {}
        for (p, o), retry in self.entries.items():
            if (p, o) in self._is_due or leased((p, o)):
                continue
            at.setdefault(p, []).append((retry.due_ms, o))
            if retry.HasField("delay_ms"):
                since.setdefault(p, []).append((_since_key(retry), o))
        for heap in (*at.values(), *since.values()):
            heapq.heapify(heap)
        self._at, self._since = at, since
        self._items = sum(map(len, at.values())) + sum(map(len, since.values()))
