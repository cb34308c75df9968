"""The consumer-group commands inside the state machine: the only writer of group state.

Every handler reads nothing but its command, the store and the state machine's applied caches,
uses the leader's ``now_ms`` carried in the command for every time-based decision, checks
everything before it writes, and writes into the apply's batch (so group state, dead-letter
copies and the applied index land together). Rejections are deterministic ``Rejected`` results.

Settling (``GroupSettleCommand``, many records per command): ACK settles; NACK and EXPIRE count a
failed attempt and schedule a retry after the backoff (or the NACK's delay) until
``max_attempts`` failures, when the record is dead-lettered; DISCARD and BADMSG dead-letter at
once. A dead letter is settled in the cursor, indexed in the group, and its record is appended
(body from the command, plus ``dlq.*`` headers) to the group's dead-letter topic in this apply.
A record with a retry entry is pending even below the watermark (a retried dead letter).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from broker.core import record_log, records
from broker.core.applied import CacheChanges, PartitionState, Rejected
from broker.core.errors import GroupExists, GroupNotFound, InvalidArgument, TopicNotFound
from broker.core.groups import layout
from broker.core.groups.config import dlq_topic_name, retry_delay_ms
from broker.core.groups.cursor import GroupCursor
from broker.core.groups.prune_roles import PruneRoles
from broker.core.state_machine import BrokerStateMachine
from broker.core.topics import normalized_config
from broker.storage import Batch, Column
from broker.v1 import internal_pb2

K = internal_pb2
_INT64_MAX = 2**63 - 1
Position = tuple[int, int]


class Outcome(enum.StrEnum):
    IGNORED = "ignored"  # settled already, or not a partition of the group
    SETTLED = "settled"
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True)
class SettleResult:
    """One outcome per entry of the command, in order."""

    outcomes: list[Outcome]


@dataclass(frozen=True)
class DeadRetried:
    """What a ``retry_dead_letters`` did: dead letters delivered again, and those left dead because
    their records were pruned (format 3 commands only; 0 otherwise)."""

    retried: int
    pruned: int


class _Apply:
    """State of one settle apply: cursors and retry entries as changed so far (the batch is not
    readable until written, so every read goes through here)."""

    def __init__(self, sm: BrokerStateMachine, meta: K.GroupMeta, batch: Batch, changes: CacheChanges) -> None:
        self.sm, self.meta, self.batch, self.changes = sm, meta, batch, changes
        self.cursors: dict[int, GroupCursor] = {}
        self.retries: dict[tuple[int, int], K.RetryState | None] = {}
        self.dlq_parts: dict[tuple[int, int], PartitionState] = {}
        self.dlq_meta: K.TopicMeta | None = None
        self.retries_changed: set[Position] = set()  # positions whose retry entry this apply wrote

    def cursor(self, partition: int) -> GroupCursor:
        if partition not in self.cursors:
            self.cursors[partition] = layout.get_cursor(self.sm.store, self.meta.group_id, partition)
        return self.cursors[partition]

    def load_retries(self, positions: list[tuple[int, int]]) -> None:
        wanted = [p for p in dict.fromkeys(positions) if p not in self.retries]
        keys = [layout.retry_key(self.meta.group_id, p, o) for p, o in wanted]
        for pos, raw in zip(wanted, self.sm.store.get_many(Column.GROUPS, keys), strict=True):
            self.retries[pos] = K.RetryState.FromString(raw) if raw is not None else None

    def set_retry(self, partition: int, offset: int, state: K.RetryState | None) -> None:
        old = self.retries.get((partition, offset))
        key = layout.retry_key(self.meta.group_id, partition, offset)
        cursor = self.cursor(partition)
        if state is None:
            if old is not None:
                self.batch.delete(Column.GROUPS, key)
                cursor.retrying -= 1
                self.retries_changed.add((partition, offset))
        else:
            self.batch.put(Column.GROUPS, key, state.SerializeToString())
            cursor.retrying += old is None
            self.retries_changed.add((partition, offset))
        self.retries[(partition, offset)] = state

    def write_cursors(self) -> None:
        for partition, cursor in self.cursors.items():
            cursor.check()
            assert cursor.retrying >= 0 and cursor.dead >= 0
            self.batch.put(Column.GROUPS, layout.cursor_key(self.meta.group_id, partition), cursor.encode())
        for (tid, partition), state in self.dlq_parts.items():
            self.sm.put_partition(tid, partition, state, self.batch, self.changes)

    # -- dead letters --------------------------------------------------------------------------
    def dead_letter(self, now_ms: int, entry: K.SettleEntry, attempts: int, reason: str) -> None:
        """Settle the record, index it as dead and append its copy to the dead-letter topic."""
        p, offset = entry.partition, entry.offset
        self.set_retry(p, offset, None)
        cursor = self.cursor(p)
        cursor.ack(offset)
        body = K.RecordBody.FromString(entry.body) if entry.body else K.RecordBody()
        dlq_partition, dlq_offset = self._append_copy(now_ms, entry, body, attempts, reason)
        key = layout.dead_key(self.meta.group_id, p, offset)
        if self.sm.store.get(Column.GROUPS, key) is None:
            cursor.dead += 1
        state = K.DeadLetterState(attempts=attempts, reason=reason, dead_ms=now_ms, dlq_partition=dlq_partition,
                                  dlq_offset=dlq_offset, has_key=body.HasField("key"), key=body.key)
        self.batch.put(Column.GROUPS, key, state.SerializeToString())

    def _append_copy(self, now_ms: int, entry: K.SettleEntry, body: K.RecordBody, attempts: int,
                     reason: str) -> tuple[int, int]:
        meta = self._dlq(now_ms)
        if meta is None:  # the name is taken by an ephemeral topic: indexed, not copied
            return 0, records.MAX_OFFSET
        headers = {"dlq.topic": self.meta.topic, "dlq.group": self.meta.group, "dlq.partition": str(entry.partition),
                   "dlq.offset": str(entry.offset), "dlq.attempts": str(attempts), "dlq.reason": reason,
                   "dlq.timestamp_ms": str(entry.timestamp_ms), "dlq.dead_ms": str(now_ms)}
        stored = entry.body + K.RecordBody(headers=headers).SerializeToString()
        tid, partition = meta.topic_id, entry.partition % meta.config.partitions
        state = self.dlq_parts.get((tid, partition)) or self.sm.counters(tid, partition)
        ts = max(now_ms, state.last_timestamp_ms)
        record_log.append(self.sm.records_batch(tid, self.batch), tid, partition, state.end_offset, ts, [stored],
                          self.sm.skeletons_batch(tid, self.batch))
        self.dlq_parts[(tid, partition)] = replace(state, end_offset=state.end_offset + 1, records=state.records + 1,
                                                   bytes=state.bytes + len(stored), last_timestamp_ms=ts)
        return partition, state.end_offset

    def _dlq(self, now_ms: int) -> K.TopicMeta | None:
        """The dead-letter topic, created here if it is missing (dropped by an operator)."""
        if self.dlq_meta is None:
            self.dlq_meta = ensure_dlq_topic(self.sm, self.meta.dlq_topic, self.meta.partitions, now_ms, self.batch,
                                             self.changes)
        if self.dlq_meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL:
            return None
        return self.dlq_meta


def ensure_dlq_topic(sm: BrokerStateMachine, name: str, partitions: int, now_ms: int, batch: Batch,
                     changes: CacheChanges) -> K.TopicMeta:
    """The dead-letter topic ``name``, created (with defaults and ``partitions``) if missing."""
    existing = sm.topic(name)
    if existing is not None:
        return existing
    config = normalized_config(internal_pb2.TopicConfig(name=name, partitions=max(partitions, 1)))
    created = sm.create_topic_in(K.CreateTopicCommand(config=config, now_ms=now_ms), batch, changes)
    assert isinstance(created, K.TopicMeta), f"creating {name}: {created}"
    return created


class GroupWrites(Protocol):
    """What the applier tells of each apply that wrote a group, once its batch is written (on the
    apply thread), and what leader-side readers ask of it from any thread. Injected, so that this
    module stays free of threads: ``broker.leader.groups.versions.GroupVersions`` in a node."""

    def bump(self, gid: int, retries: frozenset[Position] | None) -> None:
        """Group ``gid`` was written; ``retries``: the positions whose retry entry changed (None: not
        known one by one, e.g. a range delete)."""

    def version(self, gid: int) -> int:
        """Changes after every apply that wrote group ``gid``."""

    def retries_changed(self, gid: int, since: int) -> set[Position] | None:
        """The positions whose retry entry the applies after version ``since`` of ``gid`` wrote (and
        perhaps later ones'); None when they are not all known."""


class VersionsOnly:
    """:class:`GroupWrites` that counts versions and lists no positions (readers read every retry
    entry): for a state machine without a leader-side reader that threads could race."""

    def __init__(self) -> None:
        self._versions: dict[int, int] = {}

    def bump(self, gid: int, retries: frozenset[Position] | None) -> None:
        self._versions[gid] = self._versions.get(gid, 0) + 1

    def version(self, gid: int) -> int:
        return self._versions.get(gid, 0)

    def retries_changed(self, gid: int, since: int) -> set[Position] | None:
        return None


class GroupApplier:
    """Registers the group commands on ``state``; tells ``versions`` (:class:`GroupWrites`) of each
    write of a group, so leader-side readers know when and what to re-read."""

    def __init__(self, state: BrokerStateMachine, versions: GroupWrites | None = None) -> None:
        self._sm = state
        self.versions: GroupWrites = versions if versions is not None else VersionsOnly()
        self.dead_lettered = 0  # node-local counters for metrics
        self.retries_scheduled = 0
        for kind, handler in (("create_group", self._create), ("group_settle", self._settle),
                              ("seek_group", self._seek), ("pause_groups", self._pause),
                              ("delete_group", self._delete), ("rebase_group", self._rebase),
                              ("retry_dead_letters", self._retry_dead), ("purge_dead_letters", self._purge_dead),
                              ("group_barrier", lambda cmd, batch, changes: None)):
            state.register(kind, handler)
        self.prune_roles = PruneRoles(state, self._touched)  # give it to Retention.set_prune_guard

    def version(self, gid: int) -> int:
        """Changes after every apply that wrote group ``gid``."""
        return self.versions.version(gid)

    def _touched(self, gid: int, changes: CacheChanges, retries: Iterable[Position] | None = None) -> None:
        """``retries``: the positions whose retry entry the apply wrote (None: unknown, read them all)."""
        written = None if retries is None else frozenset(retries)
        changes.after_write.append(lambda: self.versions.bump(gid, written))

    def _group(self, topic: str, group: str, gid: int) -> K.GroupMeta | Rejected:
        meta = layout.get_meta(self._sm.store, topic, group)
        if meta is None or (gid and meta.group_id != gid):
            return Rejected(GroupNotFound(topic, group))
        return meta

    # -- lifecycle -----------------------------------------------------------------------------
    def _create(self, cmd: K.CreateGroupCommand, batch: Batch, changes: CacheChanges) -> object:
        if layout.get_meta(self._sm.store, cmd.topic, cmd.group) is not None:
            return Rejected(GroupExists(cmd.topic, cmd.group))
        topic = self._sm.topic(cmd.topic)
        if topic is None or topic.topic_id != cmd.topic_id:
            return Rejected(TopicNotFound(cmd.topic))
        if len(cmd.start_offsets) != topic.config.partitions:
            return Rejected(InvalidArgument(f"{len(cmd.start_offsets)} start offsets for "
                                            f"{topic.config.partitions} partitions"))
        try:
            dlq = dlq_topic_name(cmd.topic, cmd.group)
        except InvalidArgument as exc:  # the leader checks it; an old or forged command is refused here
            return Rejected(exc)
        existing = self._sm.topic(dlq)
        if existing is not None and existing.config.durability == internal_pb2.DURABILITY_EPHEMERAL:
            return Rejected(InvalidArgument(f"the dead-letter topic {dlq!r} exists and is ephemeral"))
        gid = layout.next_group_id(self._sm.store)
        meta = K.GroupMeta(topic=cmd.topic, group=cmd.group, group_id=gid, topic_id=topic.topic_id,
                           partitions=topic.config.partitions, config=cmd.config, created_ms=cmd.now_ms,
                           dlq_topic=dlq, start_offsets=cmd.start_offsets)
        ensure_dlq_topic(self._sm, dlq, topic.config.partitions, cmd.now_ms, batch, changes)
        self._write_new(meta, batch, changes)
        return meta

    def _write_new(self, meta: K.GroupMeta, batch: Batch, changes: CacheChanges) -> None:
        layout.set_next_group_id(batch, meta.group_id + 1)
        batch.put(Column.GROUPS, layout.meta_key(meta.topic, meta.group), meta.SerializeToString())
        for p, offset in enumerate(meta.start_offsets):
            batch.put(Column.GROUPS, layout.cursor_key(meta.group_id, p), GroupCursor(offset).encode())
        self._touched(meta.group_id, changes)

    def _delete(self, cmd: K.DeleteGroupCommand, batch: Batch, changes: CacheChanges) -> object:
        meta = self._group(cmd.topic, cmd.group, cmd.group_id)
        if isinstance(meta, Rejected):
            return meta
        batch.delete(Column.GROUPS, layout.meta_key(cmd.topic, cmd.group))
        batch.delete_range(Column.GROUPS, *layout.group_range(meta.group_id))
        self._touched(meta.group_id, changes)
        return meta

    def _rebase(self, cmd: K.RebaseGroupCommand, batch: Batch, changes: CacheChanges) -> object:
        """Follow a re-created topic: a new group id (old state range-deleted), cursors at the new
        incarnation's start, and what was left behind kept for RESET events."""
        meta = self._group(cmd.topic, cmd.group, cmd.group_id)
        if isinstance(meta, Rejected):
            return meta
        topic = self._sm.topic(cmd.topic)
        if topic is None or topic.topic_id != cmd.topic_id or len(cmd.start_offsets) != topic.config.partitions:
            return Rejected(TopicNotFound(cmd.topic))
        old = layout.get_cursors(self._sm.store, meta.group_id, meta.partitions)
        new = K.GroupMeta()
        new.CopyFrom(meta)
        new.group_id = layout.next_group_id(self._sm.store)
        new.topic_id, new.partitions = topic.topic_id, topic.config.partitions
        new.reset_from_topic_id = meta.topic_id
        new.reset_from_offsets[:] = [c.committed for c in old]
        new.start_offsets[:] = cmd.start_offsets
        batch.delete_range(Column.GROUPS, *layout.group_range(meta.group_id))
        self._touched(meta.group_id, changes)
        self._write_new(new, batch, changes)
        return new

    def _pause(self, cmd: K.PauseGroupsCommand, batch: Batch, changes: CacheChanges) -> object:
        """Set ``paused`` on one group or on every group of the topic; returns the names changed."""
        if cmd.group:
            one = layout.get_meta(self._sm.store, cmd.topic, cmd.group)
            if one is None:
                return Rejected(GroupNotFound(cmd.topic, cmd.group))
            metas = [one]
        else:
            metas = layout.topic_metas(self._sm.store, cmd.topic)
        changed = []
        for meta in metas:
            if meta.paused != cmd.paused:
                meta.paused = cmd.paused
                batch.put(Column.GROUPS, layout.meta_key(meta.topic, meta.group), meta.SerializeToString())
                self._touched(meta.group_id, changes, ())
                changed.append(meta.group)
        return changed

    # -- positions -----------------------------------------------------------------------------
    def _seek(self, cmd: K.SeekGroupCommand, batch: Batch, changes: CacheChanges) -> object:
        """Move watermarks (backwards too), forgetting acks and pending retries of those partitions;
        dead letters stay. Returns the new committed offset per partition."""
        meta = self._group(cmd.topic, cmd.group, cmd.group_id)
        if isinstance(meta, Rejected):
            return meta
        if any(p >= meta.partitions for p in cmd.partitions):
            return Rejected(InvalidArgument(f"group {cmd.group!r} has {meta.partitions} partitions"))
        moved: dict[int, int] = {}
        for p, offset in zip(cmd.partitions, cmd.offsets, strict=True):
            cursor = layout.get_cursor(self._sm.store, meta.group_id, p)
            cursor.seek(offset)
            cursor.retrying = 0
            batch.delete_range(Column.GROUPS, *layout.retry_range(meta.group_id, p))
            batch.put(Column.GROUPS, layout.cursor_key(meta.group_id, p), cursor.encode())
            moved[p] = offset
        if meta.reset_from_topic_id:  # the operator chose a position: no more RESET reports
            meta.reset_from_topic_id = 0
            del meta.reset_from_offsets[:]
            batch.put(Column.GROUPS, layout.meta_key(meta.topic, meta.group), meta.SerializeToString())
        self._touched(meta.group_id, changes)
        return moved

    def _settle(self, cmd: K.GroupSettleCommand, batch: Batch, changes: CacheChanges) -> object:
        meta = self._group(cmd.topic, cmd.group, cmd.group_id)
        if isinstance(meta, Rejected):
            return meta
        run = _Apply(self._sm, meta, batch, changes)
        positions = [(e.partition, e.offset) for e in cmd.entries if e.partition < meta.partitions]
        if cmd.commit_partitions:
            committed_acks = self._commit_all(run, cmd, positions)  # it loads the entries' retries first
        else:
            committed_acks = set()
            run.load_retries(positions)
        outcomes = [self._settle_one(run, cmd.now_ms, entry) for entry in cmd.entries]
        if committed_acks:  # an ack the commit settled ahead of it was settled by this call all the same
            for i, entry in enumerate(cmd.entries):
                if outcomes[i] is Outcome.IGNORED and entry.kind == K.SETTLE_ACK:
                    position = (entry.partition, entry.offset)
                    if position in committed_acks:
                        committed_acks.discard(position)  # once: a repeat in the same call is a repeat
                        outcomes[i] = Outcome.SETTLED
        run.write_cursors()
        self._touched(meta.group_id, changes, run.retries_changed)
        return SettleResult(outcomes)

    def _commit_all(self, run: _Apply, cmd: K.GroupSettleCommand, positions: list[Position]) -> set[Position]:
        """Apply the command's commits (they run ahead of its entries); returns the positions of its
        ack entries that were open before and that the commits settled. Only the answer uses them:
        the state is what the commits and entries make it either way."""
        run.load_retries(positions)
        open_acks = {(e.partition, e.offset) for e in cmd.entries if e.kind == K.SETTLE_ACK
                     and e.partition < run.meta.partitions and not self._settled(run, (e.partition, e.offset))}
        for p, offset in zip(cmd.commit_partitions, cmd.commit_offsets, strict=True):
            if p < run.meta.partitions:
                self._commit(run, p, offset)
        return {pos for pos in open_acks if self._settled(run, pos)}

    @staticmethod
    def _settled(run: _Apply, position: Position) -> bool:
        return run.retries.get(position) is None and run.cursor(position[0]).is_settled(position[1])

    def _commit(self, run: _Apply, partition: int, offset: int) -> None:
        """Settle everything below ``offset`` (bounded by the partition's end), retries included."""
        topic = self._sm.topic(run.meta.topic)
        end = self._sm.counters(run.meta.topic_id, partition).end_offset if topic else 0
        cursor = run.cursor(partition)
        target = min(offset, end)
        if not cursor.commit_to(target):
            return
        begin, _ = layout.retry_range(run.meta.group_id, partition)
        below = layout.retry_key(run.meta.group_id, partition, target)
        for key, _value in self._sm.store.scan(Column.GROUPS, begin, below):
            run.retries[layout.position_of(key)] = K.RetryState()  # known to exist: set_retry deletes it
            run.set_retry(partition, layout.position_of(key)[1], None)

    def _settle_one(self, run: _Apply, now_ms: int, entry: K.SettleEntry) -> Outcome:
        p, offset = entry.partition, entry.offset
        if p >= run.meta.partitions:
            return Outcome.IGNORED
        retry = run.retries.get((p, offset))
        cursor = run.cursor(p)
        if retry is None and cursor.is_settled(offset):
            return Outcome.IGNORED
        config = run.meta.config
        if entry.kind == K.SETTLE_ACK:
            run.set_retry(p, offset, None)
            cursor.ack(offset)
            return Outcome.SETTLED
        attempts = (retry.attempts if retry is not None else 0) + 1
        if entry.kind in (K.SETTLE_DISCARD, K.SETTLE_BADMSG):
            run.dead_letter(now_ms, entry, attempts, entry.reason or "discarded")
            self.dead_lettered += 1
            return Outcome.DEAD
        assert entry.kind in (K.SETTLE_NACK, K.SETTLE_EXPIRE), entry.kind
        if attempts >= config.max_attempts:
            why = entry.reason or ("lease expired" if entry.kind == K.SETTLE_EXPIRE else "nacked")
            run.dead_letter(now_ms, entry, attempts, f"{why} (attempt {attempts} of {config.max_attempts})")
            self.dead_lettered += 1
            return Outcome.DEAD
        delay = entry.delay_ms if entry.HasField("delay_ms") and entry.delay_ms >= 0 else retry_delay_ms(
            config, attempts)
        body = K.RecordBody.FromString(entry.body) if entry.body else K.RecordBody()
        due_ms = min(now_ms + delay, _INT64_MAX)  # the leader bounds delays; a forged one must still fit
        state = K.RetryState(attempts=attempts, due_ms=due_ms, delay_ms=delay, reason=entry.reason,
                             has_key=body.HasField("key"), key=body.key)
        run.set_retry(p, offset, state)
        self.retries_scheduled += 1
        return Outcome.RETRY

    # -- dead letters --------------------------------------------------------------------------
    def _retry_dead(self, cmd: K.RetryDeadLettersCommand, batch: Batch, changes: CacheChanges) -> object:
        """Dead letters back to delivery (attempts start again); returns :class:`DeadRetried`.

        With ``start_offsets`` (format 3, one per partition, the leader's cut) a dead letter below
        its partition's start stays dead: its record was pruned, so a retry would only dead-letter
        it again. Without them (older commands) every one found goes back, as before."""
        meta = self._group(cmd.topic, cmd.group, cmd.group_id)
        if isinstance(meta, Rejected):
            return meta
        store, gid = self._sm.store, meta.group_id
        if cmd.all:
            found = [(p, o, d) for p, o, d in layout.dead_letters(store, gid)]
        else:
            keys = [layout.dead_key(gid, p, o) for p, o in zip(cmd.partitions, cmd.offsets, strict=True)]
            raws = store.get_many(Column.GROUPS, keys)
            found = [(p, o, K.DeadLetterState.FromString(raw))
                     for p, o, raw in zip(cmd.partitions, cmd.offsets, raws, strict=True) if raw is not None]
        found = list(dict(((p, o), (p, o, d)) for p, o, d in found).values())
        starts = cmd.start_offsets
        pruned = 0
        if len(starts) == meta.partitions:
            kept = [(p, o, d) for p, o, d in found if p >= len(starts) or o >= starts[p]]
            pruned, found = len(found) - len(kept), kept
        run = _Apply(self._sm, meta, batch, changes)
        run.load_retries([(p, o) for p, o, _ in found])
        for p, offset, dead in found:
            batch.delete(Column.GROUPS, layout.dead_key(gid, p, offset))
            run.cursor(p).dead -= 1
            run.set_retry(p, offset, K.RetryState(attempts=0, due_ms=cmd.now_ms, delay_ms=0,
                                                  reason="retried from dead letters", has_key=dead.has_key,
                                                  key=dead.key))
        run.write_cursors()
        self._touched(gid, changes, run.retries_changed)
        return DeadRetried(len(found), pruned)

    def _purge_dead(self, cmd: K.PurgeDeadLettersCommand, batch: Batch, changes: CacheChanges) -> object:
        """Forget every dead letter of the group (their copies stay in the dead-letter topic)."""
        meta = self._group(cmd.topic, cmd.group, cmd.group_id)
        if isinstance(meta, Rejected):
            return meta
        purged = 0
        run = _Apply(self._sm, meta, batch, changes)
        for p in range(meta.partitions):
            cursor = run.cursor(p)
            purged += cursor.dead
            cursor.dead = 0
        batch.delete_range(Column.GROUPS, *layout.dead_range(meta.group_id))
        run.write_cursors()
        self._touched(meta.group_id, changes, ())
        return purged
