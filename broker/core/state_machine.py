"""The deterministic state machine: the only writer of replicated state.

Contract (see ``broker.replication.StateMachine``): every node applies the same committed
commands in the same order and ends in the same state. Each apply writes its data, the updated
partition counters and the applied Raft index in ONE store batch, and any index at or below the
stored applied index is skipped, so replays after a restart or a resent range change nothing.
A command that cannot be applied (e.g. the topic vanished between submit and commit) is rejected
deterministically: the result carries the error and nothing is written except the index.

Layout in ``Column.META``: ``applied`` -> >Q index; ``next_topic_id`` -> >I;
``t/<name>`` -> TopicMeta; ``p/`` + >II(topic_id, partition) -> PartitionMeta; ``cluster_format`` ->
>I (``core/formats.py``); ``apply_digest`` -> >QQI (``core/apply_digest.py``).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import operator
import shutil
import struct
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

from broker.core import append, dedup, formats, record_log, records, sessions
from broker.core.applied import (
    AppendPolicy,
    CacheChanges,
    ChangeSignal,
    Handler,
    PartitionState,
    Rejected,
)
from broker.core.apply_digest import DIGEST_FORMAT, ApplyDigests
from broker.core.errors import ApplyFailed, InvalidArgument, TopicExists, TopicNotFound
from broker.storage import Batch, Column, StorageFailure, Store
from broker.storage.memory import MemoryStore
from broker.v1 import internal_pb2

log = logging.getLogger(__name__)

_APPLIED = b"applied"
_NEXT_TOPIC_ID = b"next_topic_id"
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_PART = struct.Struct(">II")


def _topic_key(name: str) -> bytes:
    return b"t/" + name.encode()


def _partition_key(topic_id: int, partition: int) -> bytes:
    return b"p/" + _PART.pack(topic_id, partition)


class LostSpan(NamedTuple):
    """Offsets ``[first, view_start)`` of one `memory` partition that this process lost at its start
    (:meth:`BrokerStateMachine.lost_partitions`), and the bytes the counters count for them."""

    topic: str
    topic_id: int
    partition: int
    first: int
    view_start: int
    lost_bytes: int


class _Lost:
    """What this process lost of one `memory` partition at its start (a restart, a snapshot
    installed, a replayed apply): offsets ``[first, view_start)``, and how many of the partition's
    counted bytes they hold (``bytes``; kept exact as cuts take them: :meth:`BrokerStateMachine.cut_records`).
    Local knowledge, never replicated."""

    __slots__ = ("first", "view_start", "bytes")

    def __init__(self, first: int, view_start: int, lost_bytes: int) -> None:
        self.first, self.view_start, self.bytes = first, view_start, lost_bytes

    def view(self, st: PartitionState) -> PartitionState:
        """The partition as this node's readers see it: from ``view_start`` while the replicated
        start is below it. Before command format 5 every node also decided from this view (which is
        why restarted nodes diverged: docs/design/memory-topics.md)."""
        if st.start_offset >= self.view_start:
            return st
        lost_records = self.view_start - st.start_offset
        return replace(st, start_offset=self.view_start, records=max(st.records - lost_records, 0),
                       bytes=max(st.bytes - self.bytes, 0))


class BrokerStateMachine:
    """Applies :class:`internal_pb2.Command` bytes to a :class:`Store` and keeps read caches."""

    def __init__(self, store: Store, changes: ChangeSignal, volatile: Store | None = None, *,
                 journaled: bool = False, exclusive: contextlib.AbstractContextManager[object] | None = None) -> None:
        """``changes`` is told after every apply that changed topics or records (and after a
        restore); readers wait on it through :meth:`wait_for_change`.

        ``journaled``: a Raft journal keeps every applied command until a snapshot covering it is
        durable, so applies are written without the store's write-ahead log (``Store.write(wal=
        False)``): the journal is the WAL. After a crash the store is at its last flush (every
        snapshot flushes it first); its applied index says where the replay starts, and the journal
        holds every command since the last snapshot, or the snapshot is newer and is restored. Off
        for a state machine whose commands nobody replays (in-memory replicators in tests).

        A replay re-applies `memory` topics' appends too; :meth:`journal_opened` bounds it, so that
        a restart loses their records whatever the store had flushed (SPEC §2.1).

        ``exclusive`` (a lock; none: this state machine is used from one thread): held by every
        apply, restore and discard, and by :meth:`refill`, which another thread calls (the apply
        side takes no lock of its own: it imports nothing of threads)."""
        self._store = store
        self._store_wal = not journaled
        # records of `memory` topics: replicated, but kept only in this process (SPEC §2.1)
        self._volatile = volatile if volatile is not None else MemoryStore()
        self._volatile_batch: Batch | None = None
        self._volatile_cuts: list[tuple[int, int, int]] = []  # (topic id, partition, before) of this apply
        self._lost_cuts: list[tuple[tuple[int, int], int]] = []  # (partition, lost bytes cut) of this apply
        # `memory` partitions whose records this process lost at its start (local, never replicated),
        # and the view of each that its readers get while the replicated start is below what it holds
        self._lost: dict[tuple[int, int], _Lost] = {}
        self._views: dict[tuple[int, int], PartitionState] = {}
        # held by every apply, restore and discard, and by :meth:`refill` (the one writer that is not
        # on the replicator's thread: records another node sends back into the volatile store)
        self._apply_lock = exclusive if exclusive is not None else contextlib.nullcontext()
        self.refilled_records = 0  # records of `memory` topics copied back from other nodes (refill)
        self._handlers: dict[str, Handler] = {}
        self._policy: AppendPolicy | None = None
        self._drop_listeners: list[Callable[[str], None]] = []
        # commands this process recorded as failed at the apply wall, by kind (not replicated: every
        # node should count the same, and a node whose count differs runs code that applies
        # differently; exported as raftbroker_apply_failures_total)
        self.failed_applies: collections.Counter[str] = collections.Counter()
        self._changes = changes
        # commands at or below this index were in the journal before this start (journal_opened)
        self._replay_until = 0
        self.digests = ApplyDigests()  # the running digest of apply outcomes (core/apply_digest.py)
        self._load_caches()

    # -- caches ------------------------------------------------------------------------------
    def _load_caches(self) -> None:
        record_log.upgrade(self._store)  # stores written before one value per batch (a no-op after)
        raw = self._store.get(Column.META, _APPLIED)
        self._applied = _U64.unpack(raw)[0] if raw else 0
        raw = self._store.get(Column.META, _NEXT_TOPIC_ID)
        self._next_topic_id = _U32.unpack(raw)[0] if raw else 1
        self._cluster_format = formats.stored_cluster_format(self._store)
        self.digests.load(self._store)
        topics: dict[str, internal_pb2.TopicMeta] = {}
        for _, value in self._store.scan(Column.META, b"t/", b"t0"):
            meta = internal_pb2.TopicMeta.FromString(value)
            topics[meta.config.name] = meta
        partitions: dict[tuple[int, int], PartitionState] = {}
        for key, value in self._store.scan(Column.META, b"p/", b"p0"):
            partitions[_PART.unpack(key[2:])] = PartitionState.from_proto(
                internal_pb2.PartitionMeta.FromString(value))
        memory = internal_pb2.DURABILITY_MEMORY
        self._volatile_ids = {m.topic_id for m in topics.values() if m.config.durability == memory}
        self._topics = topics
        self._partitions = partitions
        self._drop_volatile_records()

    def _drop_volatile_records(self) -> None:
        """After a (re)load, `memory` topics keep their offsets and counters but no records: this
        node's view of each starts at its end offset, so a reader asking for older records gets
        SKIP_FORWARD."""
        batch = self._volatile.batch()
        batch.delete_range(Column.RECORDS, b"", b"\xff" * records.RECORD_KEY.size)
        self._volatile.write(batch)
        self._lost, self._views = {}, {}
        for key, st in self._partitions.items():
            if key[0] in self._volatile_ids and st.start_offset < st.end_offset:
                self._lose(key, st.start_offset, st)

    def _lose(self, key: tuple[int, int], first: int, st: PartitionState) -> None:
        """This process holds none of ``key``'s records below ``st.end_offset``."""
        self._lost[key] = lost = _Lost(first, st.end_offset, st.bytes)
        self._views[key] = lost.view(st)

    def _forget_volatile_records(self, commit: CacheChanges) -> list[tuple[int, int]]:
        """A replayed apply (see :meth:`journal_opened`): drop its writes to the volatile store and
        start its `memory` partitions' view at their end, as after a load. Their counters stay what
        every node writes; only this node's view and memory differ (set after the write:
        :meth:`_commit_caches`)."""
        self._volatile_batch = None
        memory = internal_pb2.DURABILITY_MEMORY
        volatile = self._volatile_ids | {m.topic_id for m in commit.created if m.config.durability == memory}
        return [key for key in commit.partitions if key[0] in volatile]

    def _update_views(self, changes: CacheChanges) -> None:
        """After a write: the views of the lost `memory` partitions it changed (or dropped)."""
        for key, cut in self._lost_cuts:
            lost = self._lost.get(key)
            if lost is not None:
                lost.bytes = max(lost.bytes - cut, 0)
        for key in [k for k in self._lost if k not in self._partitions] if changes.dropped else ():
            del self._lost[key]
            self._views.pop(key, None)
        for key in changes.partitions.keys() & self._lost.keys():
            st = self._partitions[key]
            lost = self._lost[key]
            if st.start_offset > lost.view_start:  # deleted past what it lost: nothing is missing now
                del self._lost[key]
                self._views.pop(key, None)
                continue
            view = lost.view(st)
            if view is st:
                self._views.pop(key, None)
            else:
                self._views[key] = view

    def topic(self, name: str) -> internal_pb2.TopicMeta | None:
        """The applied metadata of ``name`` (treat as read-only)."""
        return self._topics.get(name)

    def topic_count(self) -> int:
        return len(self._topics)

    def topics(self) -> list[internal_pb2.TopicMeta]:
        return sorted(self._topics.values(), key=lambda m: m.config.name)

    @property
    def cluster_format(self) -> int:
        """The cluster's command format as applied here (``core/formats.py``; 0 until raised)."""
        return self._cluster_format

    def partition(self, topic_id: int, partition: int) -> PartitionState:
        """The partition as this node's readers see it: its replicated counters, except for a
        `memory` partition whose records this process lost (:meth:`lost_at_start`), which starts
        at the records it holds. Applies decide from :meth:`counters`."""
        key = (topic_id, partition)
        return self._views.get(key) or self._partitions.get(key, PartitionState())

    def counters(self, topic_id: int, partition: int) -> PartitionState:
        """What applies decide from: the replicated counters, the same on every node. Before
        command format 5 (:data:`formats.MEMORY_SKELETON_FORMAT`), this node's view (what code
        before it decided from, so that nodes of both releases agree during an upgrade)."""
        key = (topic_id, partition)
        if self._cluster_format < formats.MEMORY_SKELETON_FORMAT:
            return self._views.get(key) or self._partitions.get(key, PartitionState())
        return self._partitions.get(key, PartitionState())

    def lost_at_start(self, topic_id: int, partition: int) -> tuple[int, int] | None:
        """``(first, view start)``: the offsets of a `memory` partition's records that this process
        lost when it started (a restart, or a snapshot installed), while nothing has deleted past
        them since; None otherwise. Readers asking for them are told (SKIP_FORWARD), never silently
        started at the view."""
        found = self._lost_span(topic_id, partition)
        return found[:2] if found is not None else None

    def _lost_span(self, topic_id: int, partition: int) -> tuple[int, int, _Lost] | None:
        """:meth:`lost_at_start`'s span, with what this process keeps of it (one look-up)."""
        key = (topic_id, partition)
        lost = self._lost.get(key)
        if lost is None or self.partition(topic_id, partition).start_offset != lost.view_start:
            return None
        if self._cluster_format < formats.MEMORY_SKELETON_FORMAT:  # the counters followed the view
            return lost.first, lost.view_start, lost
        start = self._partitions.get(key, PartitionState()).start_offset  # what was cut since is not lost
        first = max(lost.first, start)
        return (first, lost.view_start, lost) if first < lost.view_start else None

    def lost_records(self) -> int:
        """How many records of `memory` topics this process lost at its start and does not hold
        (:meth:`lost_at_start`, over every partition; also while the journal replays)."""
        total = 0
        for tid, partition in list(self._lost):
            span = self.lost_at_start(tid, partition)
            total += span[1] - span[0] if span is not None else 0
        return total

    def lost_partitions(self) -> list[LostSpan]:
        """The `memory` partitions this process lost records of that :meth:`refill` can take back
        from another node: from command format 5 on (the records' skeletons check what comes back)."""
        if self._cluster_format < formats.MEMORY_SKELETON_FORMAT or not self._lost or self.replaying:
            return []
        names = {m.topic_id: m.config.name for m in self._topics.values()}
        out = []
        for tid, partition in list(self._lost):
            span = self._lost_span(tid, partition)
            if span is not None and tid in names:
                out.append(LostSpan(names[tid], tid, partition, span[0], span[1], span[2].bytes))
        return out

    def lost_views(self) -> list[tuple[int, int, int]]:
        """``(topic id, partition, view start)`` of every `memory` partition whose records this
        process lost at its start and does not hold (:meth:`lost_at_start`; also while the journal
        replays)."""
        out = []
        for tid, partition in list(self._lost):
            span = self.lost_at_start(tid, partition)
            if span is not None:
                out.append((tid, partition, span[1]))
        return out

    def lost_span(self, span: LostSpan) -> LostSpan | None:
        """What is still lost of ``span``'s partition (:meth:`lost_partitions`, for that one alone):
        None once it is all taken back, cut, or the topic is gone."""
        if self._cluster_format < formats.MEMORY_SKELETON_FORMAT or self.replaying:
            return None
        found = self._lost_span(span.topic_id, span.partition)
        meta = self._topics.get(span.topic)
        if found is None or meta is None or meta.topic_id != span.topic_id:
            return None
        return span._replace(first=found[0], view_start=found[1], lost_bytes=found[2].bytes)

    @property
    def replaying(self) -> bool:
        """Whether this process is still re-applying the commands its Raft journal held at its start
        (:meth:`journal_opened`): their appends keep no `memory` records, and move the views."""
        return self._applied < self._replay_until

    def refill_chunk_start(self, span: LostSpan, bytes_max: int, records_max: int) -> int:
        """Where a chunk of ``span`` to take back (:meth:`refill`) starts: as far below its view start
        as ``records_max`` records and ``bytes_max`` counted bytes (the skeletons' sizes) reach, at
        least one record."""
        hi = span.view_start
        lo = max(span.first, hi - records_max)
        sizes = [size for _, size in record_log.sizes(self._store, span.topic_id, span.partition, lo, hi, fill=True)]
        total, start = 0, hi
        for size in reversed(sizes):
            if start < hi and total + size > bytes_max:
                break
            total, start = total + size, start - 1
        return start

    def refill(self, topic_id: int, partition: int, entries: Sequence[tuple[int, int, bytes]]) -> int:
        """Take back records of a `memory` partition that this process lost at its start, as another
        node holds them: ``entries`` are (offset, timestamp_ms, body), consecutive, the last one just
        below the view's start (:meth:`lost_at_start`). Each must have the body size and timestamp its
        skeleton recorded (records from before command format 5 have no skeleton of their own); those
        below the replicated start (cut meanwhile) are left out. They are written to the volatile
        store and the view starts at the first; returns how many (0: nothing taken, the view is as it
        was). Local to this process: the counters counted these records all along."""
        with self._apply_lock:
            key = (topic_id, partition)
            lost, st = self._lost.get(key), self._partitions.get(key)
            if (lost is None or st is None or not entries or topic_id not in self._volatile_ids
                    or self._cluster_format < formats.MEMORY_SKELETON_FORMAT or self.replaying):
                return 0  # replaying: a replayed append moves the view to the end again (journal_opened)
            first = entries[0][0]
            if entries[-1][0] != lost.view_start - 1 or [e[0] for e in entries] != list(range(first, lost.view_start)):
                return 0
            floor = max(lost.first, st.start_offset)
            kept = list(entries[max(floor - first, 0):])
            if not kept:
                return 0
            first = kept[0][0]
            marks = record_log.skeleton_marks(self._store, topic_id, partition, first, lost.view_start)
            for offset, timestamp_ms, body in kept:
                mark = marks.get(offset)
                if mark is not None and mark != (len(body), timestamp_ms):
                    log.warning("topic id %d partition %d: the record at %d sent back by another node has %d bytes "
                                "at %d ms, its skeleton says %s: not taken", topic_id, partition, offset, len(body),
                                timestamp_ms, mark)
                    return 0
            batch = self._volatile.batch()
            # nothing of an earlier take may stay below the view (values are keyed by their last
            # offset: another split of the same offsets would be read twice)
            record_log.delete_before(batch, topic_id, partition, first, lost.view_start)
            for timestamp_ms, run in itertools.groupby(kept, key=operator.itemgetter(1)):
                same = list(run)
                record_log.append(batch, topic_id, partition, same[0][0], timestamp_ms, [e[2] for e in same])
            self._volatile.write(batch)
            if first <= floor:  # everything lost is back (the view first, so no reader sees a gap)
                self._views.pop(key, None)
                self._lost.pop(key, None)
            else:
                counted = record_log.bytes_in(self._store, topic_id, partition, first, lost.view_start)
                back = _Lost(lost.first, first, max(lost.bytes - counted, 0))
                self._views[key] = back.view(st)
                self._lost[key] = back
            self.refilled_records += len(kept)
        self._changes.notify()
        return len(kept)

    @property
    def store(self) -> Store:
        return self._store

    def register(self, kind: str, handler: Handler) -> None:
        """Let a feature module apply the ``Command`` oneof field ``kind``. The handler gets the
        sub-message, the store batch of this apply and the cache changes to publish after it; it
        must be deterministic and may only read the store and this state machine."""
        assert kind not in self._handlers, f"a handler for {kind!r} exists"
        self._handlers[kind] = handler

    def add_drop_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(topic name)`` after each applied drop of a topic (on the apply thread:
        it must be quick and must not raise), e.g. to forget the topic's metric series."""
        self._drop_listeners.append(listener)

    def set_append_policy(self, policy: AppendPolicy) -> None:
        """Retention caps checked before, and enforced after, every append."""
        self._policy = policy

    @property
    def append_policy(self) -> AppendPolicy | None:
        return self._policy

    def put_topic(self, meta: internal_pb2.TopicMeta, batch: Batch, changes: CacheChanges) -> None:
        """Write (create or replace) a topic's metadata; the cache follows after the write."""
        batch.put(Column.META, _topic_key(meta.config.name), meta.SerializeToString())
        changes.created.append(meta)

    def put_partition(self, topic_id: int, partition: int, state: PartitionState, batch: Batch,
                      changes: CacheChanges) -> None:
        """Write a partition's new counters in ``batch``; the cache follows after the write."""
        batch.put(Column.META, _partition_key(topic_id, partition), state.to_proto().SerializeToString())
        changes.partitions[(topic_id, partition)] = state

    def records_batch(self, topic_id: int, batch: Batch) -> Batch:
        """The batch that record writes of ``topic_id`` go to in this apply."""
        if topic_id not in self._volatile_ids:
            return batch
        if self._volatile_batch is None:
            self._volatile_batch = self._volatile.batch()
        return self._volatile_batch

    def skeletons_batch(self, topic_id: int, batch: Batch) -> Batch | None:
        """Where this apply writes the skeletons of ``topic_id``'s records (``record_log``, format 4):
        the durable ``batch`` for a `memory` topic from command format 5 on, else None."""
        if topic_id in self._volatile_ids and self._cluster_format >= formats.MEMORY_SKELETON_FORMAT:
            return batch
        return None

    def sizes_store(self, topic_id: int) -> Store:
        """Where applies read the sizes and timestamps of ``topic_id``'s records: from command
        format 5 on, a `memory` topic's skeletons in the durable store, which every node holds
        (records written before it have none: they count with no bytes, and as older than any
        time); else where its records are."""
        if topic_id in self._volatile_ids and self._cluster_format >= formats.MEMORY_SKELETON_FORMAT:
            return self._store
        return self.records_store(topic_id)

    def cut_records(self, topic_id: int, partition: int, start: int, before: int, cut_bytes: int) -> None:
        """This apply deletes the records of a partition in ``[start, before)``, ``cut_bytes`` of them:
        a `memory` topic's value that straddles the cut is rewritten after the apply's write
        (``record_log.rewrite_straddling``), so what it no longer counts is freed too; and the bytes
        this node lost of it no longer count what was cut."""
        if topic_id not in self._volatile_ids:
            return
        self._volatile_cuts.append((topic_id, partition, before))
        key = (topic_id, partition)
        lost = self._lost.get(key)
        if lost is None or self._cluster_format < formats.MEMORY_SKELETON_FORMAT or start >= lost.view_start:
            return
        # [start, before) lies in what was lost (start is never below it) unless it reaches past it;
        # then the rest of what was lost goes, less what this apply's earlier cuts took
        earlier = sum(cut for k, cut in self._lost_cuts if k == key)
        self._lost_cuts.append((key, cut_bytes if before <= lost.view_start else lost.bytes - earlier))

    def records_store(self, topic_id: int) -> Store:
        """Where the records of ``topic_id`` live: RocksDB, or memory for `memory` topics."""
        return self._volatile if topic_id in self._volatile_ids else self._store

    # -- change notification -----------------------------------------------------------------
    @property
    def version(self) -> int:
        """Increases after every apply that changed topics or records (the signal's version)."""
        return self._changes.version

    def wait_for_change(self, seen_version: int, timeout_s: float) -> int:
        """Block until :attr:`version` differs from ``seen_version`` or the timeout passes
        (delegated to the injected :class:`ChangeSignal`; never called from apply)."""
        return self._changes.wait(seen_version, timeout_s)

    def notify_change(self) -> None:
        """Wake every reader waiting in :meth:`wait_for_change`."""
        self._changes.notify()

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change, on the thread that made it (often the apply's):
        it must be quick and never block (:meth:`ChangeSignal.add_listener`)."""
        self._changes.add_listener(listener)

    def remove_change_listener(self, listener: Callable[[], None]) -> None:
        self._changes.remove_listener(listener)

    # -- StateMachine protocol ---------------------------------------------------------------
    def applied_index(self) -> int:
        return self._applied

    def discard_state(self) -> None:
        """Empty the store (applied index 0): the replicator found it ahead of its journal and
        snapshot (``broker.replication.StateMachine.discard_state``)."""
        with self._apply_lock:
            self._store.clear()
            self._load_caches()
        self._changes.notify()

    def journal_opened(self, last_index: int) -> None:
        """The replicator's journal held commands up to ``last_index`` at start. Their applies keep
        no records of `memory` topics (the restart loses them, as :meth:`_load_caches` does for
        what the store held): the partitions' offsets move on and their view starts at the end."""
        self._replay_until = last_index

    def journal_truncated(self, from_index: int) -> None:
        """The journal dropped its entries from ``from_index`` on (uncommitted ones a new leader
        replaced): the commands applied there later are new, not replays. Without it a node whose
        journal ended in uncommitted entries counted itself replaying (and took no `memory` records
        back, and was not ready) until the cluster's log grew past them: an idle cluster took hours."""
        self._replay_until = min(self._replay_until, from_index - 1)

    def apply(self, index: int, command: bytes | memoryview) -> object:
        """Apply the command at Raft ``index``; never raises for a command it cannot carry out.

        A handler that raises (a bug, or a command no leader should have submitted) leaves nothing
        of its work behind: its batch and cache changes are dropped, only the applied index is
        written, and the result is a :class:`Rejected` with an :class:`ApplyFailed` naming the
        command kind. That outcome depends only on the command and the replicated state, so every
        node records the same failure and the log moves on, as long as every node runs the same
        code. Two cases are re-raised (logged CRITICAL), as :class:`~broker.storage.ApplyHalt`s
        that halt the node before the command: a storage failure (the node cannot know what it
        wrote), and a command of a newer format than this code applies (``core/formats.py``:
        another node may apply it, so recording a failure here would diverge).
        """
        with self._apply_lock:
            return self._apply(index, command)

    def _apply(self, index: int, command: bytes | memoryview) -> object:
        if index <= self._applied:
            return None
        self._volatile_batch = None
        self._volatile_cuts, self._lost_cuts = [], []
        commit = CacheChanges()
        batch = self._store.batch()
        try:
            result = self._dispatch(index, command, batch, commit)
        except StorageFailure:
            log.critical("storage failure while applying index %d: stopping rather than diverging", index)
            raise
        except formats.FormatTooNew as exc:
            log.critical("%s; stopping rather than diverging", exc)
            raise
        except Exception as exc:  # noqa: BLE001 - the wall: one command must never stop the log
            kind, result = self._failed(index, command, exc)
            self.failed_applies[kind] += 1
            batch, commit, self._volatile_batch = self._store.batch(), CacheChanges(), None
            self._volatile_cuts, self._lost_cuts = [], []
        replayed: list[tuple[int, int]] = []
        if index <= self._replay_until:
            replayed = self._forget_volatile_records(commit)
            self._volatile_cuts = []
        digest = self.digests.fold(batch, index, result) if self.digests.active else None
        batch.put(Column.META, _APPLIED, _U64.pack(index))
        try:
            if self._volatile_batch is not None:
                self._volatile.write(self._volatile_batch)
            for tid, partition, before in self._volatile_cuts:
                record_log.rewrite_straddling(self._volatile, tid, partition, before)
            self._store.write(batch, wal=self._store_wal)
        except Exception:
            log.critical("storage failure while writing index %d: stopping rather than diverging", index)
            raise
        self._applied = index
        if digest is not None:
            self.digests.advance(index, digest)
        self._commit_caches(commit)
        for key in replayed:
            st = self._partitions.get(key)
            if st is not None and st.start_offset < st.end_offset:
                lost = self._lost.get(key)
                self._lose(key, st.start_offset if lost is None else min(lost.first, st.start_offset), st)
        if commit:
            self._changes.notify()
        return result

    def _dispatch(self, index: int, command: bytes | memoryview, batch: Batch, commit: CacheChanges) -> object:
        cmd = internal_pb2.Command.FromString(command)
        formats.check(index, cmd)  # before anything is written: a node that cannot apply it halts
        kind = cmd.WhichOneof("body")
        if kind == "append":
            return append.apply_append(self, cmd.append, batch, commit)
        if kind == "create_topic":
            return self._create_topic(cmd.create_topic, batch, commit)
        if kind == "drop_topic":
            return self._drop_topic(cmd.drop_topic, batch, commit)
        if kind == "expire_dedup":
            self._expire_dedup(cmd.expire_dedup, batch)
            return None
        if kind == "reset_watermark":
            return self._reset_watermark(cmd.reset_watermark, batch)
        if kind == "set_format":
            return self._set_format(index, cmd, batch, commit)
        if kind is not None and kind in self._handlers:
            return self._handlers[kind](getattr(cmd, kind), batch, commit)
        self.failed_applies[kind or "empty"] += 1  # e.g. a kind only newer code knows
        return Rejected(ApplyFailed(f"unknown command {kind!r}"))

    @staticmethod
    def _failed(index: int, command: bytes | memoryview, exc: Exception) -> tuple[str, Rejected]:
        """The command's kind and the deterministic result of a command whose apply raised (see
        :meth:`apply`)."""
        try:
            kind = internal_pb2.Command.FromString(command).WhichOneof("body") or "empty"
        except Exception:  # noqa: BLE001 - an undecodable command is reported as such
            kind = "undecodable"
        log.error("command %s at index %d could not be applied (recorded as failed on every node)",
                  kind, index, exc_info=exc)
        return kind, Rejected(ApplyFailed(f"the {kind} command could not be applied: {type(exc).__name__}: {exc}"))

    def _commit_caches(self, changes: CacheChanges) -> None:
        """Publish cache changes only after the batch is in the store.

        Updates of existing partitions are single dict stores; adding or removing keys
        replaces the dicts (copy on write) so readers iterating them never see a resize.
        """
        topics, partitions = self._topics, self._partitions
        if changes.created or changes.dropped or not changes.partitions.keys() <= partitions.keys():
            topics, partitions = dict(topics), dict(partitions)
        for meta in changes.dropped:
            topics.pop(meta.config.name, None)
            for p in range(meta.config.partitions):
                partitions.pop((meta.topic_id, p), None)
        for meta in changes.dropped:
            self._volatile_ids.discard(meta.topic_id)
        for meta in changes.created:
            topics[meta.config.name] = meta
            if meta.config.durability == internal_pb2.DURABILITY_MEMORY:
                self._volatile_ids.add(meta.topic_id)
            self._next_topic_id = max(self._next_topic_id, meta.topic_id + 1)
        partitions.update(changes.partitions)
        self._topics, self._partitions = topics, partitions
        if self._lost:
            self._update_views(changes)
        for callback in changes.after_write:
            callback()
        for meta in changes.dropped:
            for listener in self._drop_listeners:
                try:
                    listener(meta.config.name)
                except Exception:  # noqa: BLE001 - bookkeeping outside the replicated state
                    log.exception("drop listener failed for topic %s", meta.config.name)

    def _expire_dedup(self, cmd: internal_pb2.ExpireDedupCommand, batch: Batch) -> None:
        """Every topic's expired idempotency keys and idle sessions. The window clocks are read in
        one multi-get, and a topic without one never stored a key (every remember writes it), so
        its range delete would delete nothing: skipped, as is a topic that keeps keys forever."""
        metas = [m for m in self._topics.values() if m.config.dedup_window_ms != dedup.FOREVER]
        clocks = dedup.window_clocks(self._store, [m.topic_id for m in metas])
        for meta, clock_ms in zip(metas, clocks, strict=True):
            if clock_ms is not None:
                dedup.expire_keys(batch, meta.topic_id, max(cmd.now_ms, clock_ms), meta.config.dedup_window_ms)
            sessions.expire(self._store, batch, meta.topic_id, cmd.now_ms, meta.config.dedup_window_ms)

    def _set_format(self, index: int, cmd: internal_pb2.Command, batch: Batch, commit: CacheChanges) -> object:
        """Raise the cluster's format (idempotent; never lowers it). The command must state the format
        it sets, so that every node whose code cannot apply it halts before it (``formats.check``).
        Reaching :data:`DIGEST_FORMAT` begins the apply digests, at this index on every node."""
        value = cmd.set_format.format
        if value > cmd.format:
            return Rejected(InvalidArgument(f"set_format {value} must itself state format {value}, not {cmd.format}"))
        if value > self._cluster_format:
            formats.put_cluster_format(batch, value)
            begins = value >= DIGEST_FORMAT and not self.digests.active
            if begins:
                self.digests.start(batch, index)

            crossing = self._cluster_format < formats.MEMORY_SKELETON_FORMAT <= value
            if crossing:
                self._skeletons_before_rise(batch)

            def raised() -> None:
                self._cluster_format = value
                if begins:
                    self.digests.advance(index, 0, started=True)
                if crossing and not self._store_wal:
                    # A crash must never replay commands from before the rise: they would be applied
                    # again with the older rules, which decide `memory` topics from what this process
                    # holds, and a restarted process holds none of their records (it diverged).
                    self._store.flush()
                log.info("the cluster's command format is now %d", value)

            commit.after_write.append(raised)
        return None

    def _skeletons_before_rise(self, batch: Batch) -> None:
        """At the rise to format 5: one even skeleton (``record_log``, format 5) per `memory` partition
        for the records written before it, which have none: their bytes as the counters hold them,
        spread evenly, and the partition's last timestamp (none of them is younger). Without it a trim
        counted them as 0 bytes and went on cutting (a full ``max_bytes`` topic deleted the record it
        had just acknowledged), and age retention took them for older than any time."""
        for (tid, partition), st in sorted(self._partitions.items()):
            if tid in self._volatile_ids and st.end_offset > st.start_offset:
                record_log.put_even_skeleton(batch, tid, partition, st.start_offset, st.end_offset - st.start_offset,
                                             st.bytes, st.last_timestamp_ms)

    def _reset_watermark(self, cmd: internal_pb2.ResetWatermarkCommand, batch: Batch) -> object:
        meta = self._topics.get(cmd.topic)
        if meta is None or meta.topic_id != cmd.topic_id:
            return Rejected(TopicNotFound(cmd.topic))
        existed = dedup.watermark(self._store, meta.topic_id, cmd.dedup_id) != 0  # ids are non-zero
        dedup.reset_watermark(batch, meta.topic_id, cmd.dedup_id)
        return existed

    def create_topic_in(self, cmd: internal_pb2.CreateTopicCommand, batch: Batch, commit: CacheChanges) -> object:
        """Create a topic as part of another command's apply (at most one per apply: the new id is
        taken from the counter, which advances after the write); the result is ``_create_topic``'s."""
        return self._create_topic(cmd, batch, commit)

    def _create_topic(self, cmd: internal_pb2.CreateTopicCommand, batch: Batch,
                      commit: CacheChanges) -> object:
        name = cmd.config.name
        if name in self._topics:
            return Rejected(TopicExists(name))
        meta = internal_pb2.TopicMeta(topic_id=self._next_topic_id, created_ms=cmd.now_ms)
        meta.config.CopyFrom(cmd.config)
        batch.put(Column.META, _topic_key(name), meta.SerializeToString())
        batch.put(Column.META, _NEXT_TOPIC_ID, _U32.pack(meta.topic_id + 1))
        empty = PartitionState().to_proto().SerializeToString()
        for p in range(cmd.config.partitions):
            batch.put(Column.META, _partition_key(meta.topic_id, p), empty)
            commit.partitions[(meta.topic_id, p)] = PartitionState()
        commit.created.append(meta)
        return meta

    def _drop_topic(self, cmd: internal_pb2.DropTopicCommand, batch: Batch,
                    commit: CacheChanges) -> object:
        meta = self._topics.get(cmd.name)
        if meta is None or (cmd.topic_id and meta.topic_id != cmd.topic_id):
            return Rejected(TopicNotFound(cmd.name))
        batch.delete(Column.META, _topic_key(cmd.name))
        batch.delete_range(Column.META, _partition_key(meta.topic_id, 0), _partition_key(meta.topic_id + 1, 0))
        begin, end = records.topic_range(meta.topic_id)
        batch.delete_range(Column.RECORDS, begin, end)
        if meta.topic_id in self._volatile_ids:
            self._volatile_batch = self._volatile.batch()
            self._volatile_batch.delete_range(Column.RECORDS, begin, end)
        batch.delete_range(Column.DEDUP, *dedup.topic_range(meta.topic_id))
        commit.dropped.append(meta)
        return meta

    # -- snapshots ---------------------------------------------------------------------------
    def write_snapshot(self, directory: str) -> None:
        self._store.checkpoint(directory)

    def restore_snapshot(self, directory: str, index: int) -> None:
        if index <= self._applied:
            shutil.rmtree(directory, ignore_errors=True)
            return
        with self._apply_lock:
            self._store.replace_with(directory)
            self._load_caches()
        formats.check_data(self._cluster_format)  # a snapshot of a newer cluster: halt (the replicator does)
        log.info("restored snapshot at index %d (applied index now %d)", index, self._applied)
        self._changes.notify()
