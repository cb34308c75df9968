"""Retention caps, prune and clear (SPEC §2.2), applied inside the state machine.

Caps hold per partition: ``max_records`` and ``max_bytes`` (record bodies) are checked on every
append — ``reject`` refuses the whole batch with RESOURCE_EXHAUSTED, ``discard_old`` deletes the
oldest records in the same apply — and ``max_age_ms`` by the leader's periodic
``EnforceRetentionCommand`` (which also re-applies count and byte caps, e.g. after they were
lowered). Deleting a prefix is one range delete of the stored batches wholly before the cut (a
batch straddling it stays, filtered on read: ``broker.core.record_log``; a `memory` topic's is rewritten
with its kept records after the apply, so that its memory is freed too); the byte counter is kept
exact by reading the sizes of the deleted records from the batches' tables. Every decision
depends only on the command (its ``now_ms``) and the store, so every node deletes the same prefix.
Age is a binary search for the first young enough record (``record_log.offset_for_time``): it
relies on timestamps never decreasing in a partition, which the state machine guarantees
(log-append time, ``BrokerStateMachine._append``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from broker.core import record_log
from broker.core.applied import CacheChanges, PartitionState, PendingRecords, Rejected
from broker.core.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, TopicNotFound
from broker.core.state_machine import BrokerStateMachine
from broker.storage import Batch
from broker.v1 import internal_pb2


def _caps(config: internal_pb2.TopicConfig) -> tuple[int | None, int | None]:
    r = config.retention
    return (r.max_records if r.HasField("max_records") else None,
            r.max_bytes if r.HasField("max_bytes") else None)


def check_reject(config: internal_pb2.TopicConfig, partition: int, state: PartitionState, new_records: int,
                 new_bytes: int) -> ResourceExhausted | None:
    """For ``full_policy=reject``: the error if appending would pass a cap, else None."""
    if config.full_policy != internal_pb2.FULL_POLICY_REJECT:
        return None
    max_records, max_bytes = _caps(config)
    if max_records is not None and state.records + new_records > max_records:
        return ResourceExhausted(f"topic {config.name!r} partition {partition} is full: {state.records} records "
                                 f"+ {new_records} would pass max_records={max_records} (full_policy=reject)")
    if max_bytes is not None and state.bytes + new_bytes > max_bytes:
        return ResourceExhausted(f"topic {config.name!r} partition {partition} is full: {state.bytes} bytes "
                                 f"+ {new_bytes} would pass max_bytes={max_bytes} (full_policy=reject)")
    return None


class PruneGuard(Protocol):
    """What consumer groups decide about an explicit prune (``broker.core.groups.prune_roles``)."""

    def limit(self, topic: internal_pb2.TopicMeta, cmd: internal_pb2.PruneCommand,
              targets: dict[int, int]) -> dict[int, int] | Rejected:
        """The target per partition (delete below it), possibly lowered; Rejected to refuse it all."""
        ...


class Retention:
    """Prefix deletion for one state machine; registers its commands on construction."""

    def __init__(self, state: BrokerStateMachine) -> None:
        self._state = state
        self._guard: PruneGuard | None = None
        self.deleted_records = {"retention": 0, "prune": 0}
        state.register("prune", self._apply_prune)
        state.register("enforce_retention", self._apply_enforce)
        state.register("alter_topic", self._apply_alter)
        state.set_append_policy(self)

    def set_prune_guard(self, guard: PruneGuard) -> None:
        """Let consumer groups limit or refuse prunes (set before anything is applied)."""
        self._guard = guard

    def check(self, meta: internal_pb2.TopicMeta, partition: int, state: PartitionState, new_records: int,
              new_bytes: int) -> ResourceExhausted | None:
        return check_reject(meta.config, partition, state, new_records, new_bytes)

    def after_append(self, meta: internal_pb2.TopicMeta, partition: int, state: PartitionState, batch: Batch,
                     changes: CacheChanges, pending: PendingRecords) -> PartitionState:
        return self.trim_to_caps(meta, partition, state, batch, changes, pending)

    def delete_before(self, tid: int, partition: int, state: PartitionState, before: int, batch: Batch,
                      changes: CacheChanges, reason: str, pending: PendingRecords | None = None
                      ) -> PartitionState:
        """Delete ``[start, before)``; returns the new counters (also written to ``batch``)."""
        before = min(before, state.end_offset)
        if before <= state.start_offset:
            return state
        # The counters include this apply's own records (``pending``, not in the store yet). Counting
        # what goes reads each record in Python: a clear or prune of 10M records stalled every node
        # ~17 s and cost the leadership. So a cut to the end counts nothing, and another counts the
        # side that is smaller, what goes or what stays.
        if before == state.end_offset:
            removed, removed_bytes = state.records, state.bytes
        else:
            keep = state.end_offset - before < before - state.start_offset
            lo, hi = (before, state.end_offset) if keep else (state.start_offset, before)
            stored_end = min(hi, pending.first if pending is not None else hi)  # this apply's own: below
            counted = max(stored_end - lo, 0)  # a partition has no gaps
            counted_bytes = record_log.bytes_in(self._state.sizes_store(tid), tid, partition, lo, stored_end)
            for offset, size in pending.sizes() if pending is not None else ():  # written by this same apply
                if lo <= offset < hi:
                    counted += 1
                    counted_bytes += size
            removed, removed_bytes = ((state.records - counted, state.bytes - counted_bytes) if keep
                                      else (counted, counted_bytes))
        # batches wholly before the cut go; one straddling it stays and is filtered on read
        record_log.delete_before(self._state.records_batch(tid, batch), tid, partition, state.start_offset, before)
        if self._state.skeletons_batch(tid, batch) is not None:  # a `memory` topic's skeletons go with them
            record_log.delete_before(batch, tid, partition, state.start_offset, before)
        removed, removed_bytes = max(min(removed, state.records), 0), max(min(removed_bytes, state.bytes), 0)
        self._state.cut_records(tid, partition, state.start_offset, before, removed_bytes)
        new = replace(state, start_offset=before, records=state.records - removed, bytes=state.bytes - removed_bytes)
        self._state.put_partition(tid, partition, new, batch, changes)
        self.deleted_records[reason] += removed
        return new

    def trim_to_caps(self, meta: internal_pb2.TopicMeta, partition: int, state: PartitionState, batch: Batch,
                     changes: CacheChanges, pending: PendingRecords | None = None) -> PartitionState:
        """``discard_old``: delete the oldest records until the partition fits its caps."""
        max_records, max_bytes = _caps(meta.config)
        if meta.config.full_policy == internal_pb2.FULL_POLICY_REJECT:
            return state
        if (max_records is None or state.records <= max_records) and (max_bytes is None or state.bytes <= max_bytes):
            return state
        # the oldest records go until the partition fits: the first cut that fits both caps, each
        # found without a step per record passed (a cap cut from 10M records to 1,000 walked them all)
        tid, before = meta.topic_id, state.start_offset
        if max_records is not None and state.records > max_records:
            before = state.start_offset + state.records - max_records  # a partition has no gaps
        if max_bytes is not None and state.bytes > max_bytes:
            stored_end = pending.first if pending is not None else state.end_offset
            cut, left = record_log.cut_for_bytes(self._state.sizes_store(tid), tid, partition, state.start_offset,
                                                 stored_end, state.bytes - max_bytes)
            for offset, record_bytes in pending.sizes() if pending is not None and left > 0 else ():
                left -= record_bytes  # written by this same apply, after the stored ones
                cut = offset + 1
                if left <= 0:
                    break
            before = max(before, cut)
        return self.delete_before(tid, partition, state, before, batch, changes, "retention", pending)

    def _apply_prune(self, cmd: internal_pb2.PruneCommand, batch: Batch, changes: CacheChanges) -> object:
        meta = self._state.topic(cmd.topic)
        if meta is None or meta.topic_id != cmd.topic_id:
            return Rejected(TopicNotFound(cmd.topic))
        if any(p >= meta.config.partitions for p in cmd.partitions):
            return Rejected(InvalidArgument(f"topic {cmd.topic!r} has {meta.config.partitions} partitions"))
        targets = {p: min(before, self._state.counters(meta.topic_id, p).end_offset)
                   for p, before in zip(cmd.partitions, cmd.before_offsets, strict=True)}
        if self._guard is not None:
            limited = self._guard.limit(meta, cmd, targets)
            if isinstance(limited, Rejected):
                return limited
            targets = limited
        elif cmd.group:
            return Rejected(FailedPrecondition("this node has no consumer groups to prune by"))
        pruned = 0
        for partition, before in targets.items():
            old = self._state.counters(meta.topic_id, partition)
            new = self.delete_before(meta.topic_id, partition, old, before, batch, changes, "prune")
            pruned += old.records - new.records
        return pruned

    def _apply_enforce(self, cmd: internal_pb2.EnforceRetentionCommand, batch: Batch,
                       changes: CacheChanges) -> object:
        for meta in self._state.topics():
            retention = meta.config.retention
            if not (retention.HasField("max_age_ms") or retention.HasField("max_records")
                    or retention.HasField("max_bytes")):
                continue  # nothing to enforce: each partition's visit cost ~1-2 us, and a group's dead-letter
                # topic has as many partitions as its source (300 groups of a 1024-partition topic: an
                # idle cluster lost its leader to this walk)
            for partition in range(meta.config.partitions):
                state = self._state.counters(meta.topic_id, partition)
                if retention.HasField("max_age_ms") and state.records:
                    cutoff = record_log.offset_for_time(self._state.sizes_store(meta.topic_id), meta.topic_id,
                                                     partition, cmd.now_ms - retention.max_age_ms,
                                                     state.start_offset, state.end_offset)
                    state = self.delete_before(meta.topic_id, partition, state, cutoff, batch, changes, "retention")
                self.trim_to_caps(meta, partition, state, batch, changes)
        return None

    def _apply_alter(self, cmd: internal_pb2.AlterTopicCommand, batch: Batch, changes: CacheChanges) -> object:
        meta = self._state.topic(cmd.name)
        if meta is None or meta.topic_id != cmd.topic_id:
            return Rejected(TopicNotFound(cmd.name))
        if cmd.full_policy not in (internal_pb2.FULL_POLICY_DISCARD_OLD, internal_pb2.FULL_POLICY_REJECT):
            return Rejected(InvalidArgument(f"unknown full_policy {cmd.full_policy}"))
        new = internal_pb2.TopicMeta()
        new.CopyFrom(meta)
        new.config.retention.CopyFrom(cmd.retention)
        new.config.full_policy = cmd.full_policy
        self._state.put_topic(new, batch, changes)
        return new
