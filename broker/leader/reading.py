"""Subscriptions without a group (SPEC §3.1, §3.3): positions, batches, events, live tail.

A subscription reads the local node's applied log. It never sleeps on a timer to find new data:
it waits on the state machine's change signal, which fires after every applied batch. Loss is
never silent: a position that was pruned yields ``SKIP_FORWARD``, a record that fails its
checksum yields ``BADMSG``, and a token from an older incarnation of the topic yields ``RESET``.

Every response is bounded by count (``max_batch``) and by bytes (``response_bytes_max``): a batch
ends before the record that would take it past the byte bound, except that a batch always holds at
least one record, so a single record up to the record limit is always delivered.

Streams are step generators (:meth:`Reader.subscribe_steps`): each step does one bounded read and
yields responses, and when there is nothing to send it yields an :class:`Idle` instead of blocking,
so the gRPC layer can wait for the change signal without holding a thread. :meth:`Reader.subscribe`
is the same stream with the waits done in place (blocking), for callers that own a thread.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn

from broker.core import record_log, records
from broker.core.errors import DataLoss, FailedPrecondition, InvalidArgument, TopicNotFound
from broker.core.state_machine import BrokerStateMachine
from broker.core.topics import validate_name
from broker.leader.ephemeral import EphemeralHub
from broker.leader.filters import RecordFilter
from broker.leader.packed_reads import BatchWriter, CompactWriter, PackedBatch
from broker.storage import StoreCorruption
from broker.v1 import internal_pb2

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500
MAX_BATCH = 10_000
# How often an idle stream re-reads without a change signal (every change that matters to it, new
# records, a prune, a drop, an ephemeral publish, bumps the state's version and wakes it at once):
# a safety net only, and the cost of idle streams (1,000 streams at 0.5 s kept a node ~35% busy).
WAKE_S = 5.0
# Byte bound of one response's records (a lone record may exceed it: it is sent alone). Under the
# smallest gRPC message limit a node runs with (max_batch_bytes + 1 MiB; Node.response_bytes_max
# takes max_batch_bytes when smaller), and under the 4 MiB receive limit of a default gRPC client as
# long as records are under ~3 MiB. Each response costs a step of fixed work on top of its bytes (a
# read on the pool and the hand-offs around it, the send); 2 MiB rather than 1 read a backlog of
# 1 KiB records back 5-15 % faster (bench/NOTE.md, 2026-12-05, 11:55-12:50 UTC). The price is memory
# on the leader: a stream catching up holds about two responses (one being sent, one read ahead)
# and their copies; 8 readers catching up at once raised its peak RSS by 175 MB against 146 MB.
RESPONSE_BYTES_MAX = 2 << 20
# what protobuf adds around each record in a RecordBatch (field tag + length varint, generous)
RECORD_FRAMING_BYTES = 16
_Writer = type[BatchWriter] | type[CompactWriter]  # how stored records become a packed response


@dataclass(frozen=True)
class Idle:
    """A step of a stream with nothing to send: wait until the state machine's version differs
    from ``seen_version`` or ``timeout_s`` passes, then resume the generator."""

    seen_version: int
    timeout_s: float


Step = internal_pb2.SubscribeResponse | PackedBatch | Idle


def blocking(steps: Iterator[Step], state: BrokerStateMachine) -> Iterator[internal_pb2.SubscribeResponse]:
    """The responses of a step generator (not ``packed``), doing each :class:`Idle` wait in place
    (blocks the thread)."""
    for step in steps:
        if isinstance(step, Idle):
            state.wait_for_change(step.seen_version, step.timeout_s)
        else:
            assert not isinstance(step, PackedBatch), "a blocking stream reads messages"
            yield step


def fits(batch_bytes: int, record_bytes: int, records: int, bytes_max: int) -> bool:
    """Whether a record of ``record_bytes`` may join a batch of ``records`` records that already
    holds ``batch_bytes``: always for the first record, else only within ``bytes_max``."""
    return records == 0 or batch_bytes + record_bytes + RECORD_FRAMING_BYTES <= bytes_max


def _drop_unmatched(batch: internal_pb2.RecordBatch, record_filter: RecordFilter) -> None:
    """Keep the matching records; a filter over its budget or yielding a non-boolean ends the stream
    with its error (RESOURCE_EXHAUSTED or INVALID_ARGUMENT), never a silent empty stream."""
    keep = [r for r, match in zip(batch.records, record_filter.select(batch.records), strict=True) if match]
    if len(keep) != len(batch.records):
        del batch.records[:]
        batch.records.extend(keep)


@dataclass
class _Cursor:
    partition: int
    offset: int
    end: int | None  # stop here when the subscription ends at the log end


def _event(kind: int, topic: str, incarnation: int, partition: int, before: int, after: int,
           detail: str) -> internal_pb2.SubscribeResponse:
    def token(offset: int) -> bytes:
        return records.PositionToken(incarnation, partition, offset).encode()

    return internal_pb2.SubscribeResponse(event=internal_pb2.Event(
        type=kind, topic=topic, partition=partition, offset_before=before, offset_after=after,  # type: ignore[arg-type]
        position_before=token(before), position_after=token(after), detail=detail))


@dataclass(frozen=True)
class Subscription:
    """A ``Subscribe`` as plain input (``broker.services.wire.subscription`` builds it)."""

    topic: str
    start: internal_pb2.Position = field(default_factory=internal_pb2.Position)  # empty: earliest
    partition: int | None = None  # None: every partition
    filter: str = ""  # CEL (SPEC §3.4)
    max_batch: int = 0  # records per response; 0 = default
    stop_at_end: bool = False  # end once caught up with the log end seen at start
    group: str = ""  # a consumer group (``broker.leader.groups.delivery``); empty: stateless
    member_id: str = ""
    max_in_flight: int = 0
    group_config: internal_pb2.GroupConfig = field(default_factory=internal_pb2.GroupConfig)  # start_from set
    compact: bool = False  # packed stateless reads: stored records as ``CompactBatch`` responses



def offset_at_time(state: BrokerStateMachine, tid: int, partition: int, timestamp_ms: int) -> int:
    """The first offset of a stored partition whose record is at or after ``timestamp_ms``, as this
    node holds it; in what this node lost at its start (a `memory` topic), where a lost record may be
    (a reader starting there is told SKIP_FORWARD, never silently started later)."""
    st = state.partition(tid, partition)
    found = record_log.offset_for_time(state.records_store(tid), tid, partition, timestamp_ms, st.start_offset,
                                       st.end_offset)
    lost = state.lost_at_start(tid, partition)
    if lost is None or found != st.start_offset or timestamp_ms > st.last_timestamp_ms:
        return found
    skeletons = state.sizes_store(tid)  # from command format 5: the lost records' timestamps
    if skeletons is not state.records_store(tid):
        at = record_log.offset_for_time(skeletons, tid, partition, timestamp_ms, *lost)
        if at < lost[1] or record_log.timestamp_at(skeletons, tid, partition, lost[1] - 1) is not None:
            return at  # the first lost record at or after the time, or none of them is
    return lost[0]  # timestamps never decrease: a lost record may be at or after the time

class Reader:
    """Serves stateless subscriptions from the local applied state."""

    def __init__(self, state: BrokerStateMachine, hub: EphemeralHub | None = None,
                 require_leader: Callable[[], None] | None = None,
                 require_serving: Callable[[], None] | None = None,
                 response_bytes_max: int = RESPONSE_BYTES_MAX,
                 leader_term: Callable[[], int] | None = None) -> None:
        """``require_serving`` raises (e.g. Unavailable) when this node must not serve reads (its Raft
        halted: its state is stale); it is checked at subscribe and at every wake of a stream.
        ``require_leader`` raises (NotLeader, with the leader's address, or Unavailable) unless this
        node is a leader that has applied everything committed before its term: for ephemeral
        topics, and before a position past this node's end is refused (:meth:`_past_the_end`).
        ``leader_term`` does the same check and returns the term this node leads (ephemeral topics:
        a new leader's rings)."""
        assert response_bytes_max > 0
        self._state = state
        self._response_bytes_max = response_bytes_max
        self._hub = hub if hub is not None else EphemeralHub(state.notify_change)
        self._require_leader = require_leader or (lambda: None)
        self._require_serving = require_serving or (lambda: None)
        self._leader_term = leader_term or self._term_unknown

    def _term_unknown(self) -> int:
        """Without ``leader_term``: the leader check alone, and the hub keeps the term it has."""
        self._require_leader()
        return self._hub.term

    def subscribe(self, request: Subscription,
                  is_active: Callable[[], bool]) -> Iterator[internal_pb2.SubscribeResponse]:
        """Validate ``request`` eagerly (raising before the first item), then stream (blocking waits)."""
        return blocking(self.subscribe_steps(request, is_active), self._state)

    def subscribe_steps(self, request: Subscription, is_active: Callable[[], bool],
                        packed: bool = False) -> Iterator[Step]:
        """Validate ``request`` eagerly (raising before the first item), then stream; yields
        :class:`Idle` where the stream would wait. ``packed``: stored records without a filter come
        as :class:`PackedBatch` (serialized responses, :mod:`broker.leader.packed_reads`) for a
        caller that sends bytes as they are, ``CompactBatch`` ones when ``request.compact``; events and
        everything else stay messages."""
        self._require_serving()
        validate_name(request.topic)
        meta = self._state.topic(request.topic)
        if meta is None:
            raise TopicNotFound(request.topic)
        if request.max_batch > MAX_BATCH:
            raise InvalidArgument(f"max_batch must be at most {MAX_BATCH}, got {request.max_batch}")
        record_filter = RecordFilter(request.filter) if request.filter else None
        if request.group:
            raise InvalidArgument("consumer groups are not available in this version")
        if meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL:
            # only the leader holds an ephemeral topic's live records, and only those of its own term
            self._hub.enter_term(self._leader_term())
        cursors, first_events = self._start(request, meta)
        writer = (CompactWriter if request.compact else BatchWriter) if packed and record_filter is None else None
        return self._stream(request, meta, cursors, first_events, is_active, record_filter, writer)

    # -- start positions ---------------------------------------------------------------------
    def _start(self, request: Subscription, meta: internal_pb2.TopicMeta
               ) -> tuple[list[_Cursor], list[internal_pb2.SubscribeResponse]]:
        tid, count = meta.topic_id, meta.config.partitions
        if request.partition is not None and request.partition >= count:
            raise InvalidArgument(f"partition {request.partition} does not exist (topic has {count})")
        partitions = [request.partition] if request.partition is not None else list(range(count))
        position = request.start
        kind = position.WhichOneof("kind")
        events: list[internal_pb2.SubscribeResponse] = []
        if kind == "token":
            token = records.PositionToken.decode(position.token)
            if token.incarnation > tid:  # incarnations only grow: not an earlier one of this topic (on a
                # node that may be behind, the re-create may not have reached it: the leader decides)
                self._past_the_end(f"the position token is not of topic {meta.config.name!r} (its incarnation "
                                   f"{token.incarnation} is newer than the topic's, {tid})")
            if token.incarnation != tid and token.partition >= count:
                raise FailedPrecondition(
                    f"topic {meta.config.name!r} was re-created (incarnation {token.incarnation} -> {tid}) with "
                    f"{count} partition(s): the position token's partition {token.partition} no longer exists; "
                    "subscribe from a start position")
            if token.partition >= count or (request.partition is not None and token.partition != request.partition):
                raise InvalidArgument(f"the position token is for partition {token.partition}, "
                                      "which this subscription does not read")
            partitions = [token.partition]
            start, end = self._bounds(meta, token.partition)
            if token.incarnation != tid:
                events.append(_event(internal_pb2.EVENT_TYPE_RESET, meta.config.name, tid, token.partition,
                                     token.next_offset, start,
                                     f"topic was re-created (incarnation {token.incarnation} -> {tid})"))
                offsets = {token.partition: start}
            else:
                if token.next_offset > end:
                    self._past_the_end(f"the position token's offset {token.next_offset} is past the end "
                                       f"({end}) of partition {token.partition}")
                offsets = {token.partition: token.next_offset}
        else:
            offsets = {p: self._resolve(meta, p, position, kind, single=len(partitions) == 1) for p in partitions}
        cursors = []
        for p in partitions:
            stop = self._bounds(meta, p)[1] if request.stop_at_end else None
            cursors.append(_Cursor(p, offsets[p], stop))
        return cursors, events

    def _past_the_end(self, what: str) -> NoReturn:
        """Refuse a start position past what this node knows: a partition's end, or a topic's
        incarnation (a token newer than the topic here). Only a leader that has applied
        everything committed before its term knows the partition's end; any other node may just be
        behind: a follower learns a commit after the leader, one restarted or newly elected applies
        the entries it holds after an election, and a client resuming after a failover brings a
        position token another node issued. Such a node sends the caller to the leader (NotLeader,
        with its address) or asks it to retry (Unavailable), both retried by the SDKs; the leader
        answers INVALID_ARGUMENT."""
        self._require_leader()
        raise InvalidArgument(what)

    def _bounds(self, meta: internal_pb2.TopicMeta, partition: int) -> tuple[int, int]:
        """(start, end) offsets of one partition as this node holds it."""
        if meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL:
            start, end, _, _ = self._hub.bounds(meta.topic_id, partition)
            return start, end
        st = self._state.partition(meta.topic_id, partition)
        return st.start_offset, st.end_offset

    def _resolve(self, meta: internal_pb2.TopicMeta, partition: int, position: internal_pb2.Position,
                 kind: str | None, single: bool) -> int:
        tid = meta.topic_id
        start, end = self._bounds(meta, partition)
        if kind is None or (kind == "start" and position.start != internal_pb2.START_POSITION_LATEST):
            if kind == "start" and position.start not in internal_pb2.StartPosition.values():
                raise InvalidArgument(f"unknown start position {position.start}")
            lost = self._state.lost_at_start(tid, partition)
            return start if lost is None else lost[0]  # from what this node lost: SKIP_FORWARD says so
        if kind == "start":
            return end
        if kind == "offset":
            if position.offset > end:
                if single:
                    self._past_the_end(f"offset {position.offset} is past the end ({end}) of partition {partition}")
                return end
            return position.offset
        assert kind == "timestamp_ms"
        if meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL:
            return self._hub.first_at_or_after(tid, partition, position.timestamp_ms)
        return offset_at_time(self._state, tid, partition, position.timestamp_ms)

    # -- streaming ---------------------------------------------------------------------------
    def _stream(self, request: Subscription, meta: internal_pb2.TopicMeta,
                cursors: list[_Cursor], first: list[internal_pb2.SubscribeResponse],
                is_active: Callable[[], bool], record_filter: RecordFilter | None, writer: _Writer | None
                ) -> Iterator[Step]:
        yield from first
        batch_size = request.max_batch or DEFAULT_BATCH
        name, tid = request.topic, meta.topic_id
        while is_active():
            self._require_serving()
            seen = self._state.version
            current = self._state.topic(name)
            if current is None or current.topic_id != tid:
                raise TopicNotFound(name)
            produced = False
            ephemeral = meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL
            for cursor in cursors:
                before = cursor.offset
                items = self._read_ephemeral(name, tid, cursor, batch_size) if ephemeral else \
                    self._read(name, tid, cursor, batch_size, writer)
                for item in items:
                    if record_filter is not None and isinstance(item, internal_pb2.SubscribeResponse) and \
                            item.HasField("batch"):
                        _drop_unmatched(item.batch, record_filter)
                        if not item.batch.records:
                            continue
                    yield item
                produced = produced or cursor.offset != before
            if produced:
                continue
            if all(c.end is not None and c.offset >= c.end for c in cursors):
                return
            yield Idle(seen, WAKE_S)

    def _read_ephemeral(self, name: str, tid: int, cursor: _Cursor,
                        limit: int) -> Iterator[internal_pb2.SubscribeResponse]:
        start, end, _, _ = self._hub.bounds(tid, cursor.partition)
        if cursor.offset < start:
            yield _event(internal_pb2.EVENT_TYPE_GAP, name, tid, cursor.partition, cursor.offset, start,
                         "records were dropped: this reader fell behind the ephemeral buffer (or the leader changed)")
            cursor.offset = start
        if cursor.end is not None:
            end = min(end, cursor.end)
        if cursor.offset >= end:
            return
        held = self._hub.read(tid, cursor.partition, cursor.offset, min(limit, end - cursor.offset))
        held = [item for item in held if item.offset < end]
        if held and held[0].offset > cursor.offset:  # the ring dropped records since bounds() above
            yield _event(internal_pb2.EVENT_TYPE_GAP, name, tid, cursor.partition, cursor.offset, held[0].offset,
                         "records were dropped: this reader fell behind the ephemeral buffer")
            cursor.offset = held[0].offset
        response = internal_pb2.SubscribeResponse()
        size = 0
        for item in held:
            rec = response.batch.records.add()
            rec.MergeFromString(item.body)
            rec.topic, rec.partition = name, cursor.partition
            rec.offset, rec.timestamp_ms = item.offset, item.timestamp_ms
            rec.position = records.PositionToken(tid, cursor.partition, item.offset + 1).encode()
            rec_bytes = rec.ByteSize()
            if not fits(size, rec_bytes, len(response.batch.records) - 1, self._response_bytes_max):
                del response.batch.records[-1]  # the next read starts with it
                break
            size += rec_bytes + RECORD_FRAMING_BYTES
            cursor.offset = item.offset + 1
        if response.batch.records:
            yield response

    def _read(self, name: str, tid: int, cursor: _Cursor, limit: int,
              writer: _Writer | None) -> Iterator[internal_pb2.SubscribeResponse | PackedBatch]:
        st = self._state.partition(tid, cursor.partition)
        p = cursor.partition
        if cursor.offset < st.start_offset:
            lost = self._state.lost_at_start(tid, p)
            yield _event(internal_pb2.EVENT_TYPE_SKIP_FORWARD, name, tid, p, cursor.offset, st.start_offset,
                         "records before this position were pruned or expired" if lost is None else
                         "records before this position were lost when this node restarted (a memory topic "
                         "keeps its records in each node's memory only)")
            cursor.offset = st.start_offset
        end = st.end_offset if cursor.end is None else min(st.end_offset, cursor.end)
        if cursor.offset >= end:
            return
        store = self._state.records_store(tid)
        try:
            if writer is not None:
                yield from self._read_scan_packed(
                    name, tid, writer(name, tid, p, cursor.offset), cursor,
                    (record_log.read_spans if writer is CompactWriter else record_log.read)(
                        store, tid, p, cursor.offset, end, limit),
                    lambda n: record_log.read(store, tid, p, cursor.offset, end, n))
            else:
                yield from self._read_scan(name, tid, cursor, record_log.read(store, tid, p, cursor.offset, end, limit))
        except StoreCorruption as exc:
            log.error("topic %s partition %d: this node's store cannot read records from offset %d: %s",
                      name, p, cursor.offset, exc)
            raise DataLoss(f"topic {name} partition {p}: this node's store cannot read records from offset "
                           f"{cursor.offset} (damaged file: {exc}); read from another node") from None

    def _read_scan_packed(self, name: str, tid: int, writer: BatchWriter | CompactWriter, cursor: _Cursor,
                          scan: Iterator[record_log.Entry | record_log.Span],
                          again: Callable[[int], Iterator[record_log.Entry]]
                          ) -> Iterator[internal_pb2.SubscribeResponse | PackedBatch]:
        """:meth:`_read_scan` with the records of one response as bytes: the same records, bounds and
        events. The first gap or unreadable record hands the rest of the scan to :meth:`_read_scan`
        (which reports it); a response that does not parse is read ``again`` (the next ``n``
        records from the cursor) the per-record way."""
        remaining = record_log.entries_of(scan)  # what the writer leaves, as entries
        if isinstance(writer, CompactWriter):
            rest = writer.take(scan, self._response_bytes_max, RECORD_FRAMING_BYTES)
        else:
            stopped = writer.take(remaining, self._response_bytes_max, RECORD_FRAMING_BYTES)
            rest = None if stopped is None else iter((stopped,))
        if writer.count:
            done = writer.finish()
            if done is None:
                yield from self._read_scan(name, tid, cursor, again(writer.count))
                return
            cursor.offset = writer.next_offset
            yield done
        if rest is not None:
            yield from self._read_scan(name, tid, cursor, itertools.chain(rest, remaining))

    def _read_scan(self, name: str, tid: int, cursor: _Cursor, scan: Iterator[record_log.Entry]
                   ) -> Iterator[internal_pb2.SubscribeResponse]:
        """Records (and BADMSG / SKIP_FORWARD events) of one read, at most ``response_bytes_max``
        bytes of records per response (a lone record always goes); advances ``cursor``."""
        p = cursor.partition
        response = internal_pb2.SubscribeResponse()
        batch = response.batch
        size = 0
        try:
            for stored in scan:
                offset = stored.offset
                if offset != cursor.offset:  # pruned between our check and the scan
                    if batch.records:
                        yield response
                        response = internal_pb2.SubscribeResponse()
                        batch, size = response.batch, 0
                    yield _event(internal_pb2.EVENT_TYPE_SKIP_FORWARD, name, tid, p, cursor.offset, offset,
                                 "records before this position were pruned or expired")
                    cursor.offset = offset
                rec = batch.records.add()
                problem = record_log.parse_into(stored, rec, name, tid, p)
                if problem is not None:
                    del batch.records[-1]
                    if batch.records:
                        yield response
                        response = internal_pb2.SubscribeResponse()
                        batch, size = response.batch, 0
                    yield _event(internal_pb2.EVENT_TYPE_BADMSG, name, tid, p, offset, offset + 1,
                                 f"record skipped: {problem}")
                    cursor.offset = offset + 1
                    continue
                rec_bytes = rec.ByteSize()
                if not fits(size, rec_bytes, len(batch.records) - 1, self._response_bytes_max):
                    del batch.records[-1]  # over the byte bound: the next read starts with it
                    break
                size += rec_bytes + RECORD_FRAMING_BYTES
                cursor.offset = offset + 1
        except StoreCorruption:  # what was read before the damaged block is delivered first
            if batch.records:
                yield response
            raise
        if batch.records:
            yield response
