"""One group's leader-side delivery state: what to hand out next, to whom, and the leases.

The replicated state (cursors, retry entries, paused flag) is read from the store whenever the
group's version changes: the retry entries that the applies since the last read wrote, as the
applier lists them (``GroupVersions``), or all of them when it cannot (a seek, a runtime far behind);
the rest is leader memory and starts empty after a failover:
- ``next_fresh[p]``: offsets below it were handed out in this leader term (or are settled);
- ``ready[p]``: offsets given back (released, or taken from a member that died or lost the
  partition), delivered before anything fresh so per-partition order survives a handover;
- ``waiting[key]``: ordered groups only: records whose key was busy when their turn came.
Pick order: due retries, ready, waiting, fresh. Fresh records are taken at most ``max_pending``
offsets ahead of the committed watermark, which bounds every structure here. Thread-safe: every
public method takes :attr:`lock`.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from broker.core import record_log, records
from broker.core.errors import GroupNotFound
from broker.core.formats import DELIVERY_TOKEN_FORMAT
from broker.core.groups import layout
from broker.core.groups.apply import GroupApplier
from broker.core.groups.config import is_stream
from broker.core.groups.cursor import GroupCursor
from broker.core.state_machine import BrokerStateMachine
from broker.leader.groups.leases import Lease, LeaseTable, Position
from broker.leader.groups.membership import Membership
from broker.leader.groups.retries import RetryIndex
from broker.v1 import internal_pb2

SCAN_CHUNK = 256
RETRY_READ_GAP = 64  # offsets at most this far apart are read as one range
LEFT_MEMBERS_MAX = 10_000


@dataclass
class Delivery:
    """What one pick produced for a stream: events first, then records; ``bad`` are unreadable
    records the caller settles as BADMSG (their events are in ``events``)."""

    events: list[internal_pb2.Event] = field(default_factory=list)
    records: list[internal_pb2.Record] = field(default_factory=list)
    bad: list[internal_pb2.SettleEntry] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.events or self.records or self.bad)


class GroupRuntime:
    """Delivery decisions and leases of one group (one group id) on the leader."""

    def __init__(self, meta: internal_pb2.GroupMeta, state: BrokerStateMachine, applier: GroupApplier,
                 held: Callable[[int], frozenset[int]] = lambda topic_id: frozenset()) -> None:
        """``held``: the partitions of a topic (by id) whose `memory` records this node lost and still
        expects to take back (``MemoryRefill.held``): nothing of them is delivered meanwhile."""
        self.meta = meta
        self._held = held
        self.gid = meta.group_id
        self.lock = threading.RLock()
        self.leases = LeaseTable()
        self.gone = False
        self._state, self._applier = state, applier
        config, n = meta.config, meta.partitions
        self.members = Membership(n, config.session_timeout_ms, config.visibility_timeout_ms) if is_stream(
            config) else None
        self._cursors = [GroupCursor() for _ in range(n)]
        self._retries = RetryIndex()
        self._next_fresh: list[int | None] = [None] * n
        self._ready: list[list[int]] = [[] for _ in range(n)]
        self._waiting: dict[bytes, list[Position]] = {}
        self._version = -1
        self._reported: dict[int, set[tuple[object, ...]]] = {}
        self._skips_sent: dict[tuple[int, int], tuple[int, int]] = {}  # (stream, partition) -> (watermark, start) sent
        self._skips_told: dict[int, tuple[int, int]] = {}  # partition -> (watermark, start) a client received
        self._left: dict[str, None] = {}  # members that left: their streams get nothing more
        self._next_stream = 0
        self._rotation = 0
        self._settles = 0  # settle commands of this group being replicated (see settle_started)
        self._empty_pick_in_settle = False  # a pick found nothing while one was
        # delivery numbers (in the records' position tokens): counted from a random start, so those of
        # another leader's runtime, or of an earlier one of this leader, are unlikely to come up again
        self._deliveries = itertools.count(secrets.randbits(62) + 1)

    # -- replicated state ------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the group's replicated state if an apply changed it (sets :attr:`gone` when the
        group was deleted or rebased)."""
        with self.lock:
            version = self._applier.version(self.gid)
            if version == self._version:
                return
            store = self._state.store
            meta = layout.get_meta(store, self.meta.topic, self.meta.group)
            if meta is None or meta.group_id != self.gid:
                self.gone = True
                return
            self.meta = meta
            self._cursors = layout.get_cursors(store, self.gid, meta.partitions)
            changed = self._applier.versions.retries_changed(self.gid, self._version)
            if changed is None:
                self._retries.replace_all({(p, o): r for p, o, r in layout.retries(store, self.gid)}, self._leased)
            elif changed:
                positions = sorted(changed)
                for position, retry in zip(positions, layout.retries_at(store, self.gid, positions), strict=True):
                    self._retries.update(position, retry)
            self._version = version

    def _leased(self, position: Position) -> bool:
        return self.leases.get(position) is not None

    def current(self, position: Position, delivery: int) -> bool:
        """Whether a settle naming ``delivery`` of ``position`` (0: a token without one) may act on
        the record's lease: the token names no delivery, or the lease held now is that delivery's.
        A delivery whose lease ran out (expired, released, or lost with a leader) is over: its late
        nack, release or extend must not touch the record's next delivery."""
        if not delivery:
            return True
        with self.lock:
            lease = self.leases.get(position)
            return lease is not None and lease.delivery == delivery

    def cursor(self, partition: int) -> GroupCursor:
        return self._cursors[partition]

    def bounds(self, partition: int) -> tuple[int, int]:
        st = self._state.partition(self.meta.topic_id, partition)
        return st.start_offset, st.end_offset

    def _start(self, partition: int, known: dict[int, int]) -> int:
        """The partition's first retained offset, looked up once per ``known``."""
        start = known.get(partition)
        if start is None:
            start = known[partition] = self.bounds(partition)[0]
        return start

    def retry_state(self, position: Position) -> internal_pb2.RetryState | None:
        return self._retries.entries.get(position)

    def leased_retries(self, partition: int) -> int:
        """How many of ``partition``'s leased records have a retry entry (they are in flight again,
        not waiting for their retry)."""
        with self.lock:
            entries = self._retries.entries
            return sum((partition, lease.offset) in entries for lease in self.leases.of_partition(partition))

    def committed_below(self, partition: int, offset: int) -> bool:
        """A commit settled every record of ``partition`` below ``offset``: forget their leases, as
        an ack does (:meth:`settled`). Returns whether there were any."""
        with self.lock:
            gone = [lease.offset for lease in self.leases.of_partition(partition) if lease.offset < offset]
            for o in gone:
                self.leases.remove((partition, o))
                self._retries.unleased((partition, o))
            return bool(gone)

    def retries_as_read(self) -> tuple[dict[Position, internal_pb2.RetryState], dict[bytes, int]]:
        """The retry entries as last read (a copy), and how many of them wait per record key."""
        with self.lock:
            return dict(self._retries.entries), dict(self._retries.keys)

    # -- streams ---------------------------------------------------------------------------------
    def open_stream(self) -> int:
        with self.lock:
            self._next_stream += 1
            self._reported[self._next_stream] = set()
            return self._next_stream

    def close_stream(self, stream_id: int) -> None:
        with self.lock:
            self._reported.pop(stream_id, None)
            for key in [k for k in self._skips_sent if k[0] == stream_id]:
                del self._skips_sent[key]

    def eligible(self, member_id: str) -> list[int]:
        """Partitions whose records ``member_id`` may receive now."""
        if self.members is None:
            return list(range(self.meta.partitions))
        return self.members.assigned(member_id)

    # -- picking ---------------------------------------------------------------------------------
    def pick(self, stream_id: int, member_id: str, limit: int, now_ms: int,
             lease_now_ms: int | None = None) -> Delivery:
        """Lease up to ``limit`` records to ``stream_id`` and report new events for it. ``now_ms`` is the
        leader's wall clock (retries are due by it, see :func:`retry_due_ms`); ``lease_now_ms`` the
        leader-local monotonic clock the lease deadlines are measured on (default: ``now_ms``)."""
        with self.lock:
            out = self._pick(stream_id, member_id, limit, now_ms, now_ms if lease_now_ms is None else lease_now_ms)
            if not out and self._settles:
                self._empty_pick_in_settle = True  # its stream may wait for what the settle frees
            return out

    def _pick(self, stream_id: int, member_id: str, limit: int, now_ms: int, lease_now: int) -> Delivery:
        """:meth:`pick`, under the lock."""
        self.refresh()
        if self.gone:
            raise GroupNotFound(self.meta.topic, self.meta.group)
        out = Delivery()
        if member_id in self._left:
            return out
        eligible = self._unheld(self.eligible(member_id))
        self._events(stream_id, eligible, out)
        if self.meta.paused or limit <= 0 or not eligible:
            return out
        self._rotation = (self._rotation + 1) % len(eligible)
        order = eligible[self._rotation:] + eligible[:self._rotation]
        budget = [limit]
        self._pick_retries(set(eligible), stream_id, member_id, now_ms, lease_now, out, budget)
        for p in order:
            self._pick_ready(p, stream_id, member_id, lease_now, out, budget)
        self._pick_waiting(set(eligible), stream_id, member_id, lease_now, out, budget)
        for p in order:
            self._pick_fresh(p, stream_id, member_id, lease_now, out, budget)
        return out

    def _unheld(self, partitions: list[int]) -> list[int]:
        """``partitions`` without those whose `memory` records this node lost at its start and is
        still taking back from the other members (``held``). The group waits for them as for a
        paused group: told SKIP_FORWARD now, it would move past records another member holds, for
        good, and a retry of one of them would be dead-lettered as pruned."""
        held = self._held(self.meta.topic_id)
        if not held:
            return partitions
        tid = self.meta.topic_id
        return [p for p in partitions if p not in held or self._state.lost_at_start(tid, p) is None]

    def _pending(self, position: Position) -> bool:
        """Not settled, not leased, not waiting for a retry (retries are picked on their own)."""
        p, o = position
        return (not self._cursors[p].is_settled(o) and position not in self._retries.entries
                and self.leases.get(position) is None)

    def _key_busy(self, key: bytes | None, own_retry: bool) -> bool:
        if not self.meta.config.ordered or key is None:
            return False
        return self.leases.key_leased(key) or self._retries.keys.get(key, 0) > (1 if own_retry else 0)

    def _pick_retries(self, eligible: set[int], stream_id: int, member_id: str, now_ms: int, lease_now_ms: int,
                      out: Delivery, budget: list[int]) -> None:
        """Due retries in position order (found through the :class:`RetryIndex`, not by walking
        them all); their records are read a chunk at a time (one read per run of nearby offsets, not
        one per record: a batch value is decoded once for all it holds)."""
        for p in sorted(eligible):
            taken_all: list[int] = []
            while budget[0] > 0:
                taken = self._retries.take(p, now_ms, budget[0], self._leased)
                if not taken:
                    break
                taken_all += (o for o, _ in taken)
                self._deliver_retries(p, taken, stream_id, member_id, lease_now_ms, out, budget)
            self._retries.put_back(p, (o for o in taken_all if self.leases.get((p, o)) is None))
            if budget[0] <= 0:
                return

    def _deliver_retries(self, p: int, chunk: list[tuple[int, internal_pb2.RetryState]], stream_id: int,
                         member_id: str, now_ms: int, out: Delivery, budget: list[int]) -> None:
        """Deliver ``chunk`` (due retries of partition ``p``, not leased) while the budget lasts."""
        stored = self._read_positions([(p, o) for o, _ in chunk])
        for o, retry in chunk:
            if budget[0] <= 0:
                return
            if self._key_busy(retry.key if retry.has_key else None, own_retry=True):
                continue
            self._deliver(p, o, retry.attempts + 1, stream_id, member_id, now_ms, out, budget, stored.get((p, o)))

    def _read_positions(self, positions: list[Position]) -> dict[Position, record_log.Entry]:
        """The stored records of ``positions`` (absent: not stored, or below the partition's start),
        one range read per run of offsets at most :data:`RETRY_READ_GAP` apart."""
        tid = self.meta.topic_id
        store = self._state.records_store(tid)
        by_partition: dict[int, list[int]] = {}
        for p, o in positions:
            by_partition.setdefault(p, []).append(o)
        found: dict[Position, record_log.Entry] = {}
        for p, wanted in by_partition.items():
            start = self.bounds(p)[0]
            offsets = sorted(o for o in wanted if o >= start)
            i = 0
            while i < len(offsets):
                j = i
                while j + 1 < len(offsets) and offsets[j + 1] - offsets[j] <= RETRY_READ_GAP:
                    j += 1
                run = set(offsets[i:j + 1])
                for entry in record_log.read(store, tid, p, offsets[i], offsets[j] + 1):
                    if entry.offset in run:
                        found[(p, entry.offset)] = entry
                i = j + 1
        return found

    def _pick_ready(self, p: int, stream_id: int, member_id: str, now_ms: int, out: Delivery,
                    budget: list[int]) -> None:
        """Released records (given back, no attempt counted). One pruned since is dropped: it is
        below the watermark's gap, which this pick's SKIP_FORWARD reports and the gap's commit
        settles, as for a record nobody was handed (:meth:`_events`)."""
        heap = self._ready[p]
        start = self.bounds(p)[0]
        while heap and budget[0] > 0:
            taken: list[Position] = []  # read together
            while heap and len(taken) < budget[0]:
                o = heapq.heappop(heap)
                if o >= start and self._pending((p, o)):
                    taken.append((p, o))
            stored = self._read_positions(taken)
            for position in taken:
                if self._pending(position):  # not leased by an earlier one of the same pick
                    self._deliver(p, position[1], 1, stream_id, member_id, now_ms, out, budget, stored.get(position))

    def _pick_waiting(self, eligible: set[int], stream_id: int, member_id: str, now_ms: int, out: Delivery,
                      budget: list[int]) -> None:
        """Records of an ordered group waiting for their key; one pruned since is dropped, as a
        released one is (:meth:`_pick_ready`)."""
        taken: list[Position] = []  # the head of each key free now, read together below
        starts: dict[int, int] = {}
        for key in list(self._waiting):
            queue = self._waiting[key]
            while queue and (not self._pending(queue[0]) or queue[0][1] < self._start(queue[0][0], starts)):
                heapq.heappop(queue)
            if not queue:
                del self._waiting[key]
                continue
            if len(taken) >= budget[0] or queue[0][0] not in eligible or self._key_busy(key, own_retry=False):
                continue
            taken.append(heapq.heappop(queue))
        stored = self._read_positions(taken)
        for p, o in taken:
            if self._pending((p, o)):
                self._deliver(p, o, 1, stream_id, member_id, now_ms, out, budget, stored.get((p, o)))

    def _pick_fresh(self, p: int, stream_id: int, member_id: str, now_ms: int, out: Delivery,
                    budget: list[int]) -> None:
        start, end = self.bounds(p)
        cursor = self._cursors[p]
        floor = max(cursor.committed, start)
        nxt = self._next_fresh[p]
        nxt = floor if nxt is None else max(nxt, floor)
        limit = min(end, floor + self.meta.config.max_pending)
        tid = self.meta.topic_id
        store = self._state.records_store(tid)
        while budget[0] > 0 and nxt < limit:
            nxt = cursor.next_unsettled(nxt)
            if nxt >= limit:
                break
            scan = record_log.read(store, tid, p, nxt, limit, min(SCAN_CHUNK, limit - nxt))
            progressed = False
            for stored in scan:
                o = stored.offset
                nxt, progressed = o + 1, True
                if not self._pending((p, o)):
                    continue
                record = self._decode(p, stored, out)
                if record is None:
                    continue
                rkey = record.key if record.HasField("key") else None
                if self._key_busy(rkey, own_retry=False):
                    assert rkey is not None
                    heapq.heappush(self._waiting.setdefault(rkey, []), (p, o))
                    continue
                self._lease(record, 1, stream_id, member_id, now_ms, out, budget)
                if budget[0] <= 0:
                    break
            if not progressed:  # nothing stored in [nxt, limit): pruned under us
                nxt = limit
        self._next_fresh[p] = nxt

    def _deliver(self, p: int, o: int, attempt: int, stream_id: int, member_id: str, now_ms: int, out: Delivery,
                 budget: list[int], stored: record_log.Entry | None) -> None:
        """Lease the record at ``(p, o)`` (``stored``: as read, None if it is not stored)."""
        if stored is None:
            if o < self.bounds(p)[0]:  # a retry pruned while it waited: see _dead_pruned
                self._dead_pruned(p, o, out)
            else:
                self._bad(p, o, "the record is not stored", out)
            return
        record = self._decode(p, stored, out)
        if record is None:
            return
        rkey = record.key if record.HasField("key") else None
        if self._key_busy(rkey, own_retry=(p, o) in self._retries.entries):
            assert rkey is not None
            heapq.heappush(self._waiting.setdefault(rkey, []), (p, o))
            return
        self._lease(record, attempt, stream_id, member_id, now_ms, out, budget)

    def _decode(self, p: int, stored: record_log.Entry, out: Delivery) -> internal_pb2.Record | None:
        record = internal_pb2.Record()
        problem = record_log.parse_into(stored, record, self.meta.topic, self.meta.topic_id, p)
        if problem is not None:
            self._bad(p, stored.offset, f"record skipped: {problem}", out)
            return None
        return record

    def _dead_pruned(self, p: int, o: int, out: Delivery) -> None:
        """A retry whose record was pruned while it waited. Above the watermark its loss is the
        SKIP_FORWARD's, as for every record below the partition's start (this pick's events came
        first); a retried dead letter below the watermark was delivered before it died. Either way
        it is not a BADMSG, since nothing is wrong with the store. It had failed before, so it is
        dead-lettered (without a body) and its failures stay on record. Released and waiting
        records, which never failed, are only dropped (:meth:`_pick_ready`)."""
        out.bad.append(internal_pb2.SettleEntry(kind=internal_pb2.SETTLE_BADMSG, partition=p, offset=o,
                                                reason="pruned before its retry"))

    def _bad(self, p: int, o: int, detail: str, out: Delivery) -> None:
        out.events.append(self.event(internal_pb2.EVENT_TYPE_BADMSG, p, o, o + 1, detail))
        out.bad.append(internal_pb2.SettleEntry(kind=internal_pb2.SETTLE_BADMSG, partition=p, offset=o,
                                                reason=f"badmsg: {detail}"))

    def _lease(self, record: internal_pb2.Record, attempt: int, stream_id: int, member_id: str, now_ms: int,
               out: Delivery, budget: list[int]) -> None:
        record.delivery_attempt = attempt
        key = record.key if record.HasField("key") and self.meta.config.ordered else None
        deadline = now_ms + self.meta.config.visibility_timeout_ms
        delivery = 0
        if self._state.cluster_format >= DELIVERY_TOKEN_FORMAT:  # every member's code reads such a token
            delivery = next(self._deliveries)
            record.position = records.PositionToken(self.meta.topic_id, record.partition, record.offset + 1,
                                                    delivery).encode()
        self.leases.add(Lease(record.partition, record.offset, stream_id, member_id, deadline, attempt, key,
                              after_skip=self._skips_sent.get((stream_id, record.partition)), delivery=delivery))
        out.records.append(record)
        budget[0] -= 1

    # -- events ----------------------------------------------------------------------------------
    def event(self, kind: int, p: int, before: int, after: int, detail: str,
              before_incarnation: int | None = None) -> internal_pb2.Event:
        tid = self.meta.topic_id
        old = tid if before_incarnation is None else before_incarnation
        return internal_pb2.Event(
            type=kind, topic=self.meta.topic, partition=p, offset_before=before, offset_after=after,  # type: ignore[arg-type]
            position_before=records.PositionToken(old, p, before).encode(),
            position_after=records.PositionToken(tid, p, after).encode(), detail=detail)

    def _events(self, stream_id: int, partitions: list[int], out: Delivery) -> None:
        """RESET while a re-created topic's partition has no progress yet; SKIP_FORWARD while the
        watermark is below the first retained record. Each reported once per stream (a SKIP_FORWARD
        again only for a gap the one sent does not cover: the watermark moved back, or more went)."""
        reported = self._reported.setdefault(stream_id, set())
        meta = self.meta
        for p in partitions:
            cursor = self._cursors[p]
            start, _ = self.bounds(p)
            if meta.reset_from_topic_id and p < len(meta.start_offsets) and not cursor.ranges \
                    and cursor.committed <= meta.start_offsets[p] and ("reset", p) not in reported:
                reported.add(("reset", p))
                before = meta.reset_from_offsets[p] if p < len(meta.reset_from_offsets) else 0
                out.events.append(self.event(
                    internal_pb2.EVENT_TYPE_RESET, p, before, meta.start_offsets[p],
                    f"topic was re-created (incarnation {meta.reset_from_topic_id} -> {meta.topic_id})",
                    before_incarnation=meta.reset_from_topic_id))
            if cursor.committed < start and not _covers(self._skips_sent.get((stream_id, p)), cursor.committed, start):
                self._skips_sent[(stream_id, p)] = (cursor.committed, start)
                lost = self._state.lost_at_start(meta.topic_id, p)
                out.events.append(self.event(internal_pb2.EVENT_TYPE_SKIP_FORWARD, p, cursor.committed, start,
                                             "records before this position were pruned or expired" if lost is None
                                             else "records before this position were lost when this node restarted "
                                             "(a memory topic keeps its records in each node's memory only)"))

    def confirm_told(self, positions: list[Position]) -> None:
        """The client settled ``positions`` (ack, nack, discard) or released them (a nack with
        ``release``). An extend proves nothing: the SDKs' ``claim`` extends what it took before its
        caller sees anything (the HTTP gateway's claim too). A lease handed to a stream after
        that stream was sent SKIP_FORWARD for its partition proves that the client received the
        event: a stream's responses arrive in order, the event before the record. From then on
        :meth:`skip_told` holds for that gap, even after the stream ended (the acks of what a
        stream received often come after it)."""
        with self.lock:
            for position in positions:
                lease = self.leases.get(position)
                if lease is not None and lease.after_skip is not None:
                    self._skips_told[lease.partition] = lease.after_skip

    def skip_told(self, partition: int, start: int) -> bool:
        """Whether a client of this group has received SKIP_FORWARD, since this runtime began (this
        leader's term), saying that ``partition``'s records from its watermark up to ``start`` are
        gone (:meth:`confirm_told`). An event sent is not enough: a connection that breaks right
        after it loses it, and the next stream must be told again."""
        with self.lock:
            return _covers(self._skips_told.get(partition), self._cursors[partition].committed, start)

    # -- lease changes -----------------------------------------------------------------------------
    def settle_started(self) -> None:
        """A settle command of this group is about to be replicated. Its apply wakes the group's
        streams before :meth:`settle_ended` forgets its leases, so a stream's pick in between finds
        them still held (no room, a key still busy) and the stream would wait for the next change of
        anything, or ``WAKE_S``: a consumer acking one message at a time got 16 msg/s
        (bench/NOTE.md, 2026-12-06). :meth:`settle_ended` says when such a pick happened."""
        with self.lock:
            self._settles += 1

    def settle_ended(self, entries: list[internal_pb2.SettleEntry] | None) -> bool:
        """The settle command begun with :meth:`settle_started` was applied (``entries``: its leases
        are forgotten, see :meth:`settled`) or failed (None: its leases stay). Returns whether a pick
        found nothing to deliver while a settle was in flight (once per such pick): the caller then
        wakes the streams."""
        with self.lock:
            self._settles -= 1
            if entries is None:
                return False  # kept for a settle that frees something
            self.settled(entries)
            woken, self._empty_pick_in_settle = self._empty_pick_in_settle, False
            return woken

    def settled(self, entries: list[internal_pb2.SettleEntry]) -> None:
        """Forget the leases of applied settle entries (an EXPIRE only removes the expired lease)."""
        with self.lock:
            for entry in entries:
                position = (entry.partition, entry.offset)
                lease = self.leases.get(position)
                if lease is not None and (entry.kind != internal_pb2.SETTLE_EXPIRE or lease.expiring):
                    self.leases.remove(position)
                    self._retries.unleased(position)

    def release(self, positions: list[Position]) -> int:
        """Give leases back for immediate redelivery (no attempt counted); returns how many."""
        with self.lock:
            released = 0
            for p, o in positions:
                if self.leases.remove((p, o)) is not None:
                    self._retries.unleased((p, o))
                    heapq.heappush(self._ready[p], o)
                    released += 1
            return released

    def leave(self, member_id: str) -> int:
        """``member_id`` is gone for good (it said so): give its leases back at once and deliver
        nothing more to its streams. Returns how many leases were released."""
        with self.lock:
            self._left[member_id] = None
            while len(self._left) > LEFT_MEMBERS_MAX:
                del self._left[next(iter(self._left))]
            return self.release([lease.position for lease in self.leases.of_member(member_id)])

    def rejoin(self, member_id: str) -> None:
        with self.lock:
            self._left.pop(member_id, None)

    def give_back(self, leases: list[Lease]) -> None:
        with self.lock:
            self.release([lease.position for lease in leases])

    def take_expired(self, now_ms: int) -> list[Lease]:
        """Leases past their deadline, marked as being expired (the caller replicates EXPIRE)."""
        with self.lock:
            return self.leases.take_expired(now_ms)

    def unexpire(self, leases: list[Lease]) -> None:
        """The EXPIRE could not be replicated: try again later."""
        with self.lock:
            self.leases.unexpire(leases)

    def reset_partitions(self, partitions: list[int]) -> None:
        """After a seek: forget leases and delivery progress of ``partitions``."""
        with self.lock:
            for p in partitions:
                for lease in self.leases.of_partition(p):
                    self.leases.remove(lease.position)
                    self._retries.unleased(lease.position)
                self._ready[p] = []
                self._next_fresh[p] = None
            for key in list(self._waiting):
                self._waiting[key] = [pos for pos in self._waiting[key] if pos[0] not in partitions]
                heapq.heapify(self._waiting[key])
            self._version = -1

    def next_due_ms(self, member_id: str, now_ms: int) -> int | None:
        """When (leader wall clock) the earliest retry this member could receive that is not due at
        ``now_ms`` falls due (None: none waits). Retries due already do not count: a pick at
        ``now_ms`` delivered them, or they wait for what wakes a stream anyway (the lease of the
        retried record itself or of another record with its key, room in the stream, a paused group
        resumed); counting them made an idle stream wake every millisecond while one was leased.
        Neither do retries whose records are leased: the lease's end wakes the stream."""
        with self.lock:
            return self._retries.next_due_ms(self.eligible(member_id), now_ms, self._leased)


def _covers(told: tuple[int, int] | None, watermark: int, start: int) -> bool:
    """Whether a SKIP_FORWARD of ``told`` (watermark, first retained offset) says all that one from
    ``watermark`` to ``start`` would: the records in between were among those it said were gone."""
    return told is not None and told[0] <= watermark and start <= told[1]
