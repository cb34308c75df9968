"""The broker's leader-side operations: validate, build a command, replicate, answer.

``TopicLog`` is what the gRPC servicers delegate to. It checks every input before anything is
submitted (so bad input changes nothing), assigns partitions and stamps time on the leader, and
answers with plain results. Its inputs and outputs are plain (:class:`PublishBatch`,
:class:`TopicView`, the internal ``TopicConfig``): ``broker.services.wire`` translates the public
API to them and back; gRPC specifics (status codes, metadata, streams) stay in ``broker.services``.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from broker.clock import Clock
from broker.core import dedup, records, sessions
from broker.core.applied import Appended, Rejected
from broker.core.errors import FailedPrecondition, InvalidArgument, TopicNotFound
from broker.core.groups import layout as group_layout
from broker.core.groups.config import DLQ_SUFFIX, validate_group_name
from broker.core.state_machine import BrokerStateMachine
from broker.core.topics import check_ephemeral_caps, check_topic_count, normalized_config, validate_name
from broker.leader import memory_topics, partitioning, publish_ids, schemas
from broker.leader.ephemeral import EphemeralHub
from broker.leader.publishing import Placement, PublishBatch, Published, PublishItem
from broker.leader.route_copies import VIA_HEADER
from broker.leader.submitter import CommandSubmitter
from broker.limits import ID_CHARS_MAX, Limits
from broker.protowire import ByLength, varint
from broker.replication import CommandPieces
from broker.v1 import internal_pb2

__all__ = ["Limits", "Placement", "PreparedPublish", "PublishBatch", "Published", "PublishItem", "TopicLog",
           "TopicView"]

_OPS = frozenset(internal_pb2.Op.values())
WATERMARKS_PAGE_MAX = 10_000  # GetWatermarks asked for a page: at most this many (256-character ids: ~2.7 MB)


T = TypeVar("T")
Offload = Callable[[Callable[[], T]], Awaitable[T]]  # runs a blocking function off the event loop


_APPEND_TAG = b"\x1a"  # Command.append: field 3, length-delimited
_BODY_TAG = b"\x2a"  # AppendCommand.bodies: field 5, length-delimited
_BODY_HEADS = ByLength(lambda n: _BODY_TAG + varint(n))


def append_command_pieces(append: internal_pb2.AppendCommand, bodies: list[bytes], suffix: bytes = b"",
                          lengths: list[int] | None = None) -> CommandPieces:
    """The serialized ``Command`` whose ``append`` is ``append`` with ``body + suffix`` for each of
    ``bodies`` added to its ``bodies`` (which must be empty), as pieces: joined, they are its bytes.
    Built from pieces, each body is copied once, where the pieces are joined (the replicator joins
    them straight into the log entry: ``broker.replication.CommandPieces``). Building the message
    instead copied every body into a new bytes object (the suffix), into the message, and again
    while the serializer grew its buffer: for 1000 x 1 KiB records 4.1 against 0.6 us per record in
    a process on glibc's malloc; on a node (jemalloc) the difference was within the noise of a
    cluster run (``bench/NOTE.md``). Every per-body step (its length, its field head, the
    interleaving) is a loop in C. ``lengths``: each body's length when the caller has them (a pass
    over a thousand bodies scattered in memory costs ~50 us on a node); the command's size is
    summed from the lengths and heads, not from the pieces."""
    assert not append.bodies, "the bodies go in as pieces"
    head = append.SerializeToString()
    extra = len(suffix)
    if lengths is None:
        lengths = list(map(len, bodies))
    stored = list(map(extra.__add__, lengths)) if extra else lengths
    heads = list(map(_BODY_HEADS.__getitem__, stored))
    size = len(head) + sum(map(len, heads)) + sum(stored)
    step = 3 if extra else 2  # head, body[, suffix] per body, interleaved by slice assignments
    pieces: list[bytes] = [suffix] * (step * len(bodies) + 3)
    size_head = varint(size)
    pieces[:3] = _APPEND_TAG, size_head, head
    pieces[3::step] = heads
    pieces[4::step] = bodies
    return CommandPieces(pieces, len(_APPEND_TAG) + len(size_head) + size)


def _check_fits(config: internal_pb2.TopicConfig, bodies: list[bytes], suffix_bytes: int,
                lengths: list[int] | None) -> None:
    """Refuse a record whose stored body alone is over the topic's ``max_bytes``: it could never be
    kept (``discard_old`` deleted it in the apply that stored it, after its offset was acknowledged;
    ``reject`` called an empty partition full). Only for a cap below the record limit."""
    cap = config.retention.max_bytes
    sizes = [n + suffix_bytes for n in lengths] if lengths is not None else list(map(len, bodies))
    if max(sizes) > cap:
        i, size = next((i, n) for i, n in enumerate(sizes) if n > cap)
        raise InvalidArgument(f"record {i} is {size} bytes stored, over topic {config.name!r}'s retention "
                              f"max_bytes={cap}: it could never be kept (raise max_bytes or send smaller records)")


_VIA_BYTES = VIA_HEADER.encode()


def _held_nothing() -> None:
    return None


def _dead_letter_owner(state: BrokerStateMachine, name: str) -> tuple[str, str] | None:
    """(topic, group) of the group whose dead-letter topic ``name`` is (``TOPIC.GROUP.dlq``), or None."""
    if not name.endswith(DLQ_SUFFIX):
        return None
    stem = name[:-len(DLQ_SUFFIX)]
    for at in (i for i, c in enumerate(stem) if c == "."):
        meta = group_layout.get_meta(state.store, stem[:at], stem[at + 1:])
        if meta is not None and meta.dlq_topic == name:
            return stem[:at], stem[at + 1:]
    return None


@dataclass(frozen=True)
class PreparedPublish:
    """A checked publish, ready to submit (:meth:`TopicLog.prepare_publish`)."""

    meta: internal_pb2.TopicMeta
    command: internal_pb2.Command  # its append without bodies (see :meth:`data`)
    bodies: list[bytes]  # each record's stored body, without ``suffix``
    suffix: bytes  # what every body ends with (the origin and producer), when not in ``bodies``
    count: int  # records in the batch
    partitions: list[int]  # each record's partition, as in ``command``
    lengths: list[int] | None = None  # each of ``bodies``' length, when the checks measured them
    release: Callable[[], None] = _held_nothing  # gives back what the publish holds of the memory budget

    @property
    def ephemeral(self) -> bool:  # published by the leader's hub, without Raft
        return self.meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL

    @property
    def sync(self) -> bool:  # `fsync` topics: acknowledged once a majority has it on stable storage
        return self.meta.config.durability == internal_pb2.DURABILITY_FSYNC

    def stored_bodies(self) -> list[bytes]:
        """Each record's body as stored."""
        suffix = self.suffix
        return [body + suffix for body in self.bodies] if suffix else self.bodies

    def data(self) -> CommandPieces:
        """The serialized command, bodies included, in pieces (:func:`append_command_pieces`)."""
        return append_command_pieces(self.command.append, self.bodies, self.suffix, self.lengths)


@dataclass(frozen=True)
class PartitionFigures:
    partition: int
    start_offset: int  # first retained offset
    end_offset: int  # next offset to be assigned
    records: int
    bytes: int


@dataclass(frozen=True)
class TopicView:
    """A topic as this node sees it: its stored config, incarnation and per-partition figures."""

    config: internal_pb2.TopicConfig
    incarnation: int
    created_ms: int
    partitions: list[PartitionFigures] = field(default_factory=list)


def _origin_suffix(origin: str) -> bytes:
    """Serialized ``RecordBody.origin`` (field 10), appended to every stored body."""
    return internal_pb2.RecordBody(origin=origin).SerializeToString()


class TopicLog:
    """Topic administration and publishing on top of the replicated state machine."""

    def __init__(self, state: BrokerStateMachine, submitter: CommandSubmitter, limits: Limits,
                 origin: str, clock: Clock, hub: EphemeralHub | None = None) -> None:
        """``clock``: the node clock; its wall reading stamps every command's ``now_ms``."""
        self._state = state
        self._hub = hub if hub is not None else EphemeralHub(state.notify_change)
        self._submitter = submitter
        self._limits = limits
        self._origin_bytes = _origin_suffix(origin)
        self._round_robin = partitioning.RoundRobin()
        self._schemas = schemas.SchemaCache()
        self._clock = clock

    @property
    def limits(self) -> Limits:
        return self._limits

    # -- admin -------------------------------------------------------------------------------
    def create_topic(self, config: internal_pb2.TopicConfig) -> TopicView:
        config = normalized_config(config)
        schemas.validate_dedup_fields(list(config.dedup_fields))
        if (config.schema_json or config.dedup_fields) and config.durability == internal_pb2.DURABILITY_EPHEMERAL:
            raise InvalidArgument("ephemeral topics take neither a schema nor dedup fields")
        if self._state.topic(config.name) is None:  # else: the create is refused as it exists
            check_topic_count(self._state, self._limits.topics_max, f"topic {config.name!r}")
            memory_topics.check_config(self._state, config, self._limits.memory_topics_bytes_max)
            if config.schema_json:  # last: the one check that costs (in a helper process, bounded)
                self._schemas.check_compile(config.schema_json)
        cmd = internal_pb2.Command(create_topic=internal_pb2.CreateTopicCommand(
            config=config, now_ms=self._clock.now_ms()))
        result = self._submitter.submit(cmd, sync=config.durability == internal_pb2.DURABILITY_FSYNC)
        self._raise_rejected(result)
        return self.describe_topic(config.name)

    def drop_topic(self, name: str) -> None:
        meta = self._leader_meta(name)
        owner = _dead_letter_owner(self._state, name)
        if owner is not None:  # its group would re-create it at the next dead letter, past max_topics too
            raise FailedPrecondition(
                f"topic {name!r} is the dead-letter topic of group {owner[1]!r} of topic {owner[0]!r}: delete the "
                "group first (raftbroker group delete), or keep the topic and purge or clear it")
        cmd = internal_pb2.Command(drop_topic=internal_pb2.DropTopicCommand(name=name, topic_id=meta.topic_id))
        self._raise_rejected(self._submitter.submit(cmd))
        self._hub.forget_topic(meta.topic_id)

    def describe_topic(self, name: str) -> TopicView:
        return self._info(self._meta(name))

    def list_topics(self) -> list[TopicView]:
        """Every topic (services list them without their schemas: ``broker.services.wire``)."""
        return [self._info(meta) for meta in self._state.topics()]

    def _leader_meta(self, name: str) -> internal_pb2.TopicMeta:
        """The topic, for a change about to be submitted: leader (and ready) first, so a missing topic
        means missing from every write committed so far, not only from what this node applied."""
        self._submitter.ensure_leader()
        return self._meta(name)

    def _meta(self, name: str) -> internal_pb2.TopicMeta:
        meta = self._state.topic(name)  # only valid names were ever created
        if meta is None:
            validate_name(name)  # a bad name is INVALID_ARGUMENT, not NOT_FOUND
            raise TopicNotFound(name)
        return meta

    def _info(self, meta: internal_pb2.TopicMeta) -> TopicView:
        info = TopicView(config=meta.config, incarnation=meta.topic_id, created_ms=meta.created_ms)
        ephemeral = meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL
        for p in range(meta.config.partitions):
            if ephemeral:
                start, end, count, size = self._hub.bounds(meta.topic_id, p)
                info.partitions.append(PartitionFigures(p, start, end, count, size))
                continue
            st = self._state.partition(meta.topic_id, p)
            info.partitions.append(PartitionFigures(p, st.start_offset, st.end_offset, st.records, st.bytes))
        return info

    @property
    def hub(self) -> EphemeralHub:
        return self._hub

    @staticmethod
    def _raise_rejected(result: object) -> None:
        if isinstance(result, Rejected):
            raise result.error

    # -- publish -----------------------------------------------------------------------------
    def publish(self, request: PublishBatch, producer: str = "") -> list[Placement]:
        """:meth:`publish_placed` with one :class:`Placement` per record."""
        return [Placement(*placed) for placed in self.publish_placed(request, producer).placements]

    def publish_placed(self, request: PublishBatch, producer: str = "") -> Published:
        """Append a batch, all or nothing; answers after it is committed and applied here.
        ``producer``: the authenticated principal, stamped on every record ("" without
        authentication); a client cannot set it (``services/wire.py`` drops unknown fields, and
        ``services/packed.py`` takes no packed record with a field beyond key, value and op)."""
        prepared = self.prepare_publish(request, producer)
        result: object
        try:
            if prepared.ephemeral:
                result = self._publish_ephemeral(prepared)
            else:  # `fsync` topics: acknowledged once a majority has the entry on stable storage
                result = self._submitter.submit(prepared.data(), sync=prepared.sync)
        finally:
            prepared.release()
        return self.finish_publish(prepared, result)

    async def publish_placed_async(self, request: PublishBatch, producer: str = "",
                                   offload: Offload | None = None) -> Published:
        """:meth:`publish_placed` for a coroutine: the same checks, results and errors, and no
        thread waits for the commit (:meth:`CommandSubmitter.submit_async`). :meth:`prepare_publish`
        runs on the caller's loop, except for topics that check records against a JSON schema or
        dedup fields (``check_documents`` may take long for a big batch): ``offload`` (a runner of
        blocking functions, the call pool) runs it there when given."""
        if offload is not None and self.checks_documents(request.topic):
            prepared = await offload(functools.partial(self.prepare_publish, request, producer))
            leader_checked = False  # the loop ran other work meanwhile
        else:
            prepared = self.prepare_publish(request, producer)
            leader_checked = True  # in this step of the loop: the prepare's leader check still holds
        result: object
        try:
            if prepared.ephemeral:
                result = self._publish_ephemeral(prepared)
            else:
                result = await self._submitter.submit_async(prepared.data(), sync=prepared.sync,
                                                            leader_checked=leader_checked)
        finally:
            prepared.release()
        return self.finish_publish(prepared, result)

    def checks_documents(self, topic: str) -> bool:
        """Whether ``topic`` (if it exists) checks published records against a schema or dedup fields."""
        meta = self._state.topic(topic) if topic else None
        return meta is not None and bool(meta.config.schema_json or meta.config.dedup_fields)

    def prepare_publish(self, request: PublishBatch, producer: str = "") -> PreparedPublish:
        """Everything a publish does before it submits: checks (leader, topic, records, dedup
        fields, schema), placement, bodies and the time stamp; raises on any bad input."""
        meta = self._leader_meta(request.topic)
        cmd = internal_pb2.Command()
        append = cmd.append
        append.topic = request.topic
        append.topic_id = meta.topic_id
        placed = self._place(request, meta.config.partitions)
        append.partitions.extend(placed)
        publish_ids.check_into(request, append)
        config = meta.config
        if append.first_msg_id and config.durability != internal_pb2.DURABILITY_EPHEMERAL:
            sessions.check_form(self._state.store, meta.topic_id, append.dedup_id)
        if config.schema_json or config.dedup_fields:
            append.unique_keys.extend(self._schemas.check_documents(
                meta.topic_id, config.schema_json, config.dedup_fields, request.record_values()))
        bodies, suffix, lengths = self._bodies(request, producer)
        if config.retention.HasField("max_bytes") and config.retention.max_bytes < self._limits.record_bytes_max:
            _check_fits(config, bodies, len(suffix), lengths)
        release = _held_nothing
        if config.durability == internal_pb2.DURABILITY_MEMORY:
            size = sum(lengths) + len(suffix) * len(lengths) if lengths is not None else sum(map(len, bodies))
            release = memory_topics.check_append(self._state, meta, size, self._limits.memory_topics_bytes_max)
        append.now_ms = self._clock.now_ms()
        prepared = PreparedPublish(meta, cmd, bodies, suffix, request.count, placed, lengths, release)
        if release is not _held_nothing:  # also when a caller drops it unanswered (a cancelled call)
            weakref.finalize(prepared, release)
        return prepared

    def finish_publish(self, prepared: PreparedPublish, result: object) -> Published:
        """The answer to a prepared publish once submitted: its placements, or the rejection it met."""
        self._raise_rejected(result)
        assert isinstance(result, Appended) and len(result) == prepared.count
        return Published(result, prepared.partitions)

    def _publish_ephemeral(self, prepared: PreparedPublish) -> Appended:
        """Leader-only fan-out: no Raft, no store (SPEC §2.1). Nothing is remembered, so nothing is
        deduplicated: what the SDK sends by default (a producer-session batch by range,
        ``first_msg_id``, or idempotency keys) is accepted and ignored; a per-record producer
        session (dedup_id with msg_ids), which a caller chose for its deduplication, is refused."""
        append = prepared.command.append
        if append.dedup_id and not append.first_msg_id:
            raise InvalidArgument("ephemeral topics do not deduplicate: drop dedup_id and msg_id")
        term = self._submitter.leader_term()
        return Appended(self._hub.publish(prepared.meta.topic_id, term, prepared.partitions,
                                          prepared.stored_bodies(), append.now_ms))

    # -- retention, prune, clear ---------------------------------------------------------------
    def alter_topic(self, name: str, retention: internal_pb2.Retention, full_policy: int) -> TopicView:
        """Replace the retention caps (all three; unset = no cap) and, when given, the full policy."""
        meta = self._leader_meta(name)
        probe = internal_pb2.TopicConfig(name=name, retention=retention, full_policy=full_policy)  # type: ignore[arg-type]
        checked = normalized_config(probe)
        if full_policy == internal_pb2.FULL_POLICY_UNSPECIFIED:
            checked.full_policy = meta.config.full_policy
        checked.durability = meta.config.durability
        check_ephemeral_caps(checked)
        checked.partitions = meta.config.partitions
        memory_topics.check_config(self._state, checked, self._limits.memory_topics_bytes_max, meta.topic_id)
        cmd = internal_pb2.Command(alter_topic=internal_pb2.AlterTopicCommand(
            name=name, topic_id=meta.topic_id, retention=checked.retention, full_policy=checked.full_policy))
        self._raise_rejected(self._submitter.submit(cmd))
        return self.describe_topic(name)

    def prune(self, topic: str, partition: int | None, before_offset: int, group: str = "") -> int:
        """Delete every record before ``before_offset`` (in one partition, or in each); returns how
        many. With ``group`` (marked lead): up to its committed positions, and no further than
        ``before_offset`` unless that is 0. Groups marked protect may refuse it (FAILED_PRECONDITION)."""
        if group:
            validate_group_name(group)
        meta = self._leader_meta(topic)
        count = meta.config.partitions
        if partition is not None and partition >= count:
            raise InvalidArgument(f"partition {partition} does not exist (topic {topic!r} has {count})")
        partitions = [partition] if partition is not None else list(range(count))
        if group and before_offset == 0:
            before_offset = records.MAX_OFFSET  # no bound of its own
        elif not group:  # a group's committed positions bound it at the end already
            self._check_prune_bound(meta, partitions, before_offset)
        return self._prune(meta, partitions, [before_offset] * len(partitions), group=group)

    def _check_prune_bound(self, meta: internal_pb2.TopicMeta, partitions: list[int], before_offset: int) -> None:
        """Refuse a bound past the end of a pruned partition (as a commit past the end is, and Kafka's
        DeleteRecords): it used to empty the partition, so a typo (one digit too many) deleted every
        record. Ends only grow until the apply, so the apply needs no check of its own (it clamps)."""
        short = [(p, end) for p in partitions
                 if before_offset > (end := self._state.counters(meta.topic_id, p).end_offset)]
        if not short:
            return
        p, end = short[0]
        more = f" (and {len(short) - 1} other partition(s))" if len(short) > 1 else ""
        raise InvalidArgument(
            f"before_offset {before_offset} is past the end of partition {p} ({end}){more} of topic "
            f"{meta.config.name!r}: nothing was pruned; prune at most up to a partition's end (each partition "
            "has its own offsets: prune one partition at a time), or clear the topic to delete every record")

    def clear_topic(self, name: str) -> int:
        """Delete every record; offsets keep growing from where they were."""
        meta = self._leader_meta(name)
        partitions = list(range(meta.config.partitions))
        ends = [self._state.partition(meta.topic_id, p).end_offset for p in partitions]
        return self._prune(meta, partitions, ends, clear=True)

    def _prune(self, meta: internal_pb2.TopicMeta, partitions: list[int], before: list[int], group: str = "",
               clear: bool = False) -> int:
        if meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL:
            raise InvalidArgument("ephemeral topics store nothing to prune")
        cmd = internal_pb2.Command(prune=internal_pb2.PruneCommand(
            topic=meta.config.name, topic_id=meta.topic_id, partitions=partitions, before_offsets=before,
            group=group, clear=clear))
        result = self._submitter.submit(cmd)
        self._raise_rejected(result)
        assert isinstance(result, int)
        return result

    def enforce_retention(self) -> None:
        """Apply every topic's age (and count/bytes) caps now (leader housekeeping)."""
        self._submitter.submit(internal_pb2.Command(enforce_retention=internal_pb2.EnforceRetentionCommand(
            now_ms=self._clock.now_ms())))

    # -- dedup watermarks ----------------------------------------------------------------------
    def watermarks(self, topic: str) -> list[tuple[str, int]]:
        """Every producer session's high watermark on ``topic`` (local applied state)."""
        return self.watermarks_page(topic)[0]

    def watermarks_page(self, topic: str, after: str = "", limit: int = 0) -> tuple[list[tuple[str, int]], bool]:
        """Producer sessions' high watermarks on ``topic`` (local applied state), in dedup_id order
        after ``after``: every one when ``limit`` is 0, else a page; and whether more follow."""
        if len(after) > ID_CHARS_MAX:
            raise InvalidArgument(f"after_dedup_id is longer than {ID_CHARS_MAX} characters")
        tid = self._meta(topic).topic_id
        if not limit:
            return list(dedup.watermarks(self._state.store, tid, after)), False
        page = list(dedup.watermarks(self._state.store, tid, after, min(limit, WATERMARKS_PAGE_MAX) + 1))
        more = len(page) > min(limit, WATERMARKS_PAGE_MAX)
        return page[:min(limit, WATERMARKS_PAGE_MAX)], more

    def reset_watermark(self, topic: str, dedup_id: str) -> bool:
        """Forget ``dedup_id``'s watermark: its next message may start again at 1. Returns whether
        there was one (resetting an unknown session changes nothing and is not an error)."""
        if not dedup_id:
            raise InvalidArgument("dedup_id is required")
        if len(dedup_id) > ID_CHARS_MAX:  # no watermark can have such an id: refused, not replicated
            raise InvalidArgument(f"dedup_id is longer than {ID_CHARS_MAX} characters")
        meta = self._leader_meta(topic)
        cmd = internal_pb2.Command(reset_watermark=internal_pb2.ResetWatermarkCommand(
            topic=topic, topic_id=meta.topic_id, dedup_id=dedup_id))
        result = self._submitter.submit(cmd)
        self._raise_rejected(result)
        return result is True

    def expire_dedup(self) -> None:
        """Forget idempotency keys older than their topic's window (leader housekeeping)."""
        self._submitter.submit(internal_pb2.Command(expire_dedup=internal_pb2.ExpireDedupCommand(
            now_ms=self._clock.now_ms())))

    def _place(self, request: PublishBatch, partitions: int) -> list[int]:
        records = request.records
        count = request.count
        if not count:
            raise InvalidArgument("a publish needs at least one record")
        if count > self._limits.batch_records_max:
            raise InvalidArgument(
                f"batch of {count} records is over the limit of {self._limits.batch_records_max}")
        if request.bodies is not None:
            return self._place_lean(request, partitions)
        placed: list[int] = []
        spread = 0  # records with neither partition nor key: round-robin, one counter claim per batch
        for i, rec in enumerate(records):
            if rec.op not in _OPS:
                raise InvalidArgument(f"record {i}: unknown op {rec.op}")
            if rec.partition is not None:
                if rec.partition >= partitions:
                    raise InvalidArgument(
                        f"record {i}: partition {rec.partition} does not exist "
                        f"(topic {request.topic!r} has {partitions})")
                placed.append(rec.partition)
            elif rec.key is not None:
                placed.append(partitioning.partition_for_key(rec.key, partitions))
            else:
                placed.append(-1)
                spread += 1
        if spread:
            first = self._round_robin.claim(request.topic, spread)
            turn = itertools.count(first)
            placed = [p if p >= 0 else next(turn) % partitions for p in placed]
        return placed

    def _place_lean(self, request: PublishBatch, partitions: int) -> list[int]:
        """:meth:`_place` for the lean form (ops and the absence of explicit partitions are checked
        by ``services/packed``): by key where there is one, else round-robin, as for records."""
        count = request.count
        if request.keys is None:  # all round-robin: one claim, no per-record Python work
            first = self._round_robin.claim(request.topic, count) % partitions
            return list(itertools.islice(itertools.cycle(range(partitions)), first, first + count))
        for_key = partitioning.partition_for_key
        placed = [-1 if key is None else for_key(key, partitions) for key in request.keys]
        spread = placed.count(-1)
        if spread:
            turn = itertools.count(self._round_robin.claim(request.topic, spread))
            placed = [p if p >= 0 else next(turn) % partitions for p in placed]
        return placed

    def _bodies(self, request: PublishBatch, producer: str = "") -> tuple[list[bytes], bytes, list[int] | None]:
        """(bodies, suffix, lengths): each record's stored body is ``body + suffix``, checked against
        the record and batch limits; ``lengths`` each of ``bodies``' length (the lean form), or None."""
        origin = self._origin_bytes
        if producer:  # without authentication there is none
            origin += internal_pb2.RecordBody(producer=producer).SerializeToString()
        if request.bodies is not None:
            return request.bodies, origin, self._lean_lengths(request.bodies, origin)
        limit = self._limits.record_bytes_max
        total = 0
        bodies: list[bytes] = []
        for i, rec in enumerate(request.records):
            msg_id = rec.msg_id
            if _VIA_BYTES in rec.body and VIA_HEADER in internal_pb2.RecordBody.FromString(rec.body).headers:
                raise InvalidArgument(
                    f"record {i}: the header {VIA_HEADER!r} is reserved: a route sets it on the copies it sends to "
                    "another cluster, and a record carrying it is never mirrored back there; drop it (a record "
                    "republished from a mirrored one should not carry it)")
            body = rec.body + origin
            if msg_id:
                body += internal_pb2.RecordBody(msg_id=str(msg_id)).SerializeToString()
            if len(body) > limit:
                raise InvalidArgument(f"record {i} is {len(body)} bytes, over the limit of {limit} bytes")
            total += len(body)
            bodies.append(body)
        if total > self._limits.batch_bytes_max:
            raise InvalidArgument(
                f"batch of {total} bytes is over the limit of {self._limits.batch_bytes_max} bytes")
        return bodies, b"", None

    def _lean_lengths(self, given: list[bytes], origin: bytes) -> list[int]:
        """:meth:`_bodies`' limits for the lean form (no msg_id to append; each stored body is the
        given one followed by ``origin``): each of ``given``'s length, measured once for the checks
        and the command (``append_command_pieces``)."""
        extra = len(origin)
        limit = self._limits.record_bytes_max
        lengths = list(map(len, given))
        if max(lengths) + extra > limit:
            i, length = next((i, n) for i, n in enumerate(lengths) if n + extra > limit)
            raise InvalidArgument(f"record {i} is {length + extra} bytes, over the limit of {limit} bytes")
        total = sum(lengths) + extra * len(given)
        if total > self._limits.batch_bytes_max:
            raise InvalidArgument(
                f"batch of {total} bytes is over the limit of {self._limits.batch_bytes_max} bytes")
        return lengths
