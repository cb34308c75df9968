"""The append command: where each record of a batch goes and what is written (the apply side).

Runs inside :meth:`BrokerStateMachine.apply` like every other handler and depends only on the
command, the store and the state machine's caches. Phase 1 decides duplicates (producer sessions,
watermarks, idempotency keys) and places (offsets from each partition's end, one log-append
timestamp per partition) without writing anything; the dedup-field and retention checks may still
refuse the whole batch; phase 2 writes the records (``record_log``, one value per partition), the
dedup state and the partition counters into the apply's batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from broker.core import dedup, record_log, sessions
from broker.core.applied import Appended, CacheChanges, PartitionState, PendingRecords, Rejected
from broker.core.errors import BrokerError, InvalidArgument, TopicNotFound
from broker.storage import Batch
from broker.v1 import internal_pb2

if TYPE_CHECKING:
    from broker.core.state_machine import BrokerStateMachine


def apply_append(sm: BrokerStateMachine, cmd: internal_pb2.AppendCommand, batch: Batch, commit: CacheChanges
                 ) -> object:
    """Store a batch. Log-append time: a record's timestamp is ``max(cmd.now_ms, the partition's
    last timestamp)``, so timestamps never decrease in a partition whatever the leaders' clocks do;
    the floor is ``PartitionState.last_timestamp_ms``, written in the same batch as the records
    and read from the cache (no extra store read). ``record_log.offset_for_time`` (subscribe from a
    timestamp, retention by age) relies on it."""
    meta = sm.topic(cmd.topic)
    if meta is None or meta.topic_id != cmd.topic_id:
        return Rejected(TopicNotFound(cmd.topic))
    tid = meta.topic_id
    session: sessions.Verdict | None = None
    if cmd.first_msg_id:  # a producer-session batch: one check, one write (broker.core.sessions)
        if cmd.msg_ids or cmd.idempotency_keys:
            return Rejected(InvalidArgument("a first_msg_id batch takes no msg_id or idempotency_key per record"))
        try:
            session = sessions.check(sm.store, tid, cmd.dedup_id, cmd.first_msg_id, len(cmd.bodies))
        except InvalidArgument as err:
            return Rejected(err)
        fresh: list[bool] | None = None
        mark = 0
    else:
        checked = dedup.check_watermark(sm.store, cmd, tid)
        if isinstance(checked, BrokerError):
            return Rejected(checked)
        fresh, mark = checked
    # phase 1: decide duplicates and places without writing anything
    keys = cmd.idempotency_keys
    window = meta.config.dedup_window_ms
    window_now = dedup.window_now_ms(sm.store, tid, cmd.now_ms) if keys else cmd.now_ms
    known = dedup.lookup_keys(sm.store, tid, list(keys), window_now, window) if keys else {}
    seen: dict[str, tuple[int, int, int]] = {}
    growth: dict[int, list[int]] = {}  # partition -> [next offset, records added, bytes added, last ts]
    placements: list[tuple[int, int, int, bool]] = []
    writes: list[tuple[int, int, int, bytes, str, int]] = []  # partition, offset, ts, body, key, index
    if session is not None and session.fresh_from:  # at or below the session's watermark
        known_places = session.duplicate_places or [(p, 0, 0) for p in cmd.partitions[:session.fresh_from]]
        placements.extend((*place, True) for place in known_places)
    skip = session.fresh_from if session is not None else 0
    starts: dict[int, tuple[int, int]] = {}  # partition -> its first new offset (for the session)
    items: dict[int, Sequence[bytes]] = {}  # partition -> bodies to store, in offset order (stamped growth[p][3])
    in_runs: Sequence[int] = ()  # the partitions of the records placed by _place_all (see Appended)
    if not keys and not cmd.unique_keys and (fresh is None or all(fresh)):
        in_runs = _place_all(sm, cmd, tid, skip, growth, starts, items)
    for i, (partition, body) in enumerate(zip(cmd.partitions, cmd.bodies, strict=True) if not items else ()):
        if i < skip:
            continue
        if fresh is not None and not fresh[i]:  # at or below its producer's watermark: discarded
            placements.append((partition, 0, 0, True))
            continue
        key = keys[i] if keys else ""
        if key:
            hit = seen.get(key) or dedup.live_place(known.get(key), window_now, window)
            if hit is not None:
                placements.append((*hit, True))
                continue
        acc = growth.get(partition)
        if acc is None:
            base = sm.counters(tid, partition)
            acc = growth[partition] = [base.end_offset, 0, 0, base.last_timestamp_ms]
            starts[partition] = (base.end_offset, 0)
        offset, ts = acc[0], max(cmd.now_ms, acc[3])
        acc[0], acc[1], acc[2], acc[3] = offset + 1, acc[1] + 1, acc[2] + len(body), ts
        placements.append((partition, offset, ts, False))
        writes.append((partition, offset, ts, body, key, i))
        if key:
            seen[key] = (partition, offset, ts)
    touched: dict[int, PartitionState] = {}
    for partition, (end, added, added_bytes, ts) in growth.items():
        base = sm.counters(tid, partition)
        touched[partition] = replace(base, end_offset=end, records=base.records + added,
                                     bytes=base.bytes + added_bytes, last_timestamp_ms=ts)
    taken = dedup.check_unique(sm.store, cmd, tid, meta, [w[5] for w in writes])
    if taken is not None:
        return Rejected(taken)
    if sm.append_policy is not None:
        for partition, state in touched.items():
            old = sm.counters(tid, partition)
            error = sm.append_policy.check(meta, partition, old, state.records - old.records, state.bytes - old.bytes)
            if error is not None:
                return Rejected(error)
    # phase 2: write
    record_batch, skeletons = sm.records_batch(tid, batch), sm.skeletons_batch(tid, batch)
    if writes:  # the general path (keys, dedup fields, discarded records)
        written_bodies: dict[int, list[bytes]] = {p: [] for p in touched}
        unique = cmd.unique_keys
        for partition, _offset, _ts, body, _key, i in writes:
            if unique:
                dedup.take_unique_key(batch, tid, unique[i])
            written_bodies[partition].append(body)
        items = dict(written_bodies)
    # a partition's offsets of this apply are consecutive, all stamped alike (growth[p][3])
    pending = {p: PendingRecords(starts[p][0], growth[p][3], stored) for p, stored in items.items()}
    for partition, written in pending.items():
        record_log.append(record_batch, tid, partition, written.first, written.timestamp_ms, written.bodies,
                          skeletons)
    runs = {p: (written.first, written.timestamp_ms) for p, written in pending.items()} if in_runs else None
    if keys:
        dedup.remember_keys(batch, tid, window_now, window,
                            [(key, partition, offset, ts) for partition, offset, ts, _, key, _ in writes if key])
    if session is not None and items:  # every record of a session batch past fresh_from is written
        starts = {p: (offset, growth[p][3]) for p, (offset, _) in starts.items()}
        sessions.remember(batch, tid, cmd.dedup_id, cmd.first_msg_id + skip, cmd.partitions[skip:], starts)
    elif fresh is not None and cmd.dedup_id and mark:
        dedup.set_watermark(batch, tid, cmd.dedup_id, mark)
    for partition, state in touched.items():
        sm.put_partition(tid, partition, state, batch, commit)
        if sm.append_policy is not None:
            sm.append_policy.after_append(meta, partition, state, batch, commit, pending[partition])
    return Appended(placements, in_runs, runs)

def _place_all(sm: BrokerStateMachine, cmd: internal_pb2.AppendCommand, tid: int, skip: int,
               growth: dict[int, list[int]], starts: dict[int, tuple[int, int]],
               items: dict[int, Sequence[bytes]]) -> list[int]:
    """Phase 1 of ``_append`` when every record from ``skip`` on is stored (no idempotency keys,
    no dedup fields, none below a watermark), the common batch: the same places as the
    per-record loop (offsets from each partition's end, one timestamp per partition: the
    floor only rises with the first record), decided per partition instead of per record.
    Returns the placed records' partitions in command order: their placements are the runs
    ``starts`` and ``growth`` describe, and no per-record placement is built (see ``Appended``)."""
    partitions, bodies = cmd.partitions[skip:], cmd.bodies[skip:]
    n = len(bodies)
    if len(partitions) != n:  # a command no leader builds: the apply wall records it as failed
        raise ValueError(f"append command with {len(cmd.partitions)} partitions for {len(cmd.bodies)} bodies")
    if not n:
        return []
    if len(set(partitions)) == 1:  # one partition: no per-record Python step at all
        partition = partitions[0]
        base = sm.counters(tid, partition)
        ts, first = max(cmd.now_ms, base.last_timestamp_ms), base.end_offset
        items[partition] = bodies
        growth[partition] = [first + n, n, sum(map(len, bodies)), ts]
        starts[partition] = (first, 0)
        return partitions
    grown: dict[int, list[bytes]] = {}
    for partition, body in zip(partitions, bodies, strict=True):
        acc = growth.get(partition)
        if acc is None:
            base = sm.counters(tid, partition)
            ts = max(cmd.now_ms, base.last_timestamp_ms)
            acc = growth[partition] = [base.end_offset, 0, 0, ts]
            starts[partition] = (base.end_offset, 0)
            items[partition] = grown[partition] = []
        acc[0], acc[1], acc[2] = acc[0] + 1, acc[1] + 1, acc[2] + len(body)
        grown[partition].append(body)
    return partitions
