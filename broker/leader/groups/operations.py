"""Group administration (SPEC §3.2): describe, seek, replay, lag, pause/resume, prune roles, dead
letters, delete.

Every operation that changes group state replicates one command. Reads (describe, list, lag,
dead letters) are served by the leader after a read barrier (:meth:`GroupService.read_barrier`):
a node that lost the leadership without knowing it (cut off by a partition) cannot answer from
stale state, so committed positions read by a client never go back. :func:`lag_rows` also serves
the metrics of any node (those are this node's view, without a barrier).
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from broker.core import record_log, records
from broker.core.errors import InvalidArgument, TopicNotFound
from broker.core.formats import PRUNED_DEAD_FORMAT
from broker.core.groups import layout
from broker.core.groups.apply import DeadRetried
from broker.core.groups.config import validate_group_name
from broker.core.state_machine import BrokerStateMachine
from broker.core.topics import validate_name
from broker.leader.groups.runtime import GroupRuntime
from broker.leader.groups.service import POSITIONS_MAX, GroupService, raise_rejected
from broker.v1 import internal_pb2

K = internal_pb2
DEFAULT_DEAD_LIMIT = 100
DEAD_LIMIT_MAX = 10_000
# record copies carried by one dead-letter listing; entries past it come without their record (read it
# from the DLQ topic at dlq_partition/dlq_offset), so a listing stays far below the message limit
DEAD_RECORDS_BYTES_MAX = 4 << 20


@dataclass(frozen=True)
class GroupView:
    """A group as stored, with its live members and their partitions (leader only, when known)."""

    meta: internal_pb2.GroupMeta
    members: list[tuple[str, list[int]]]


@dataclass(frozen=True)
class LagRow:
    """One partition's figures (the public ``PartitionLag``)."""

    partition: int
    start_offset: int
    end_offset: int
    committed: int
    lag: int
    in_flight: int
    retrying: int
    dead: int
    lag_ms: int


@dataclass(frozen=True)
class GroupLag:
    """A group's figures as the leader answers them: per partition, and the applied index they
    were read at on ``node`` (the leader's gRPC address)."""

    paused: bool
    partitions: list[LagRow]
    applied_index: int
    node: str


def lag_rows(state: BrokerStateMachine, meta: K.GroupMeta, now_ms: int, rt: GroupRuntime | None) -> list[LagRow]:
    """Per partition of ``meta``: offsets, unsettled count and age, leases, retries, dead letters.
    Records below the first retained one count as settled (they are gone)."""
    rows = []
    cursors = layout.get_cursors(state.store, meta.group_id, meta.partitions)
    topic = state.topic(meta.topic)
    for p, cursor in enumerate(cursors):
        st = state.partition(meta.topic_id, p) if topic is not None and topic.topic_id == meta.topic_id else None
        start, end = (st.start_offset, st.end_offset) if st is not None else (cursor.committed, cursor.committed)
        committed = cursor.committed
        cursor.commit_to(start)
        lag = cursor.unsettled(end)
        lag_ms = 0
        if lag:
            first = cursor.next_unsettled(cursor.committed)
            ts = record_log.timestamp_at(state.records_store(meta.topic_id), meta.topic_id, p, first)
            lag_ms = max(0, now_ms - ts) if ts is not None else 0
        in_flight = rt.leases.in_partition(p) if rt is not None else 0
        retrying = cursor.retrying - (rt.leased_retries(p) if rt is not None and in_flight else 0)
        rows.append(LagRow(p, start, end, committed, lag, in_flight, max(retrying, 0), cursor.dead, lag_ms))
    return rows


class GroupOperations:
    """The Admin group RPCs, on the leader."""

    def __init__(self, service: GroupService) -> None:
        self._service = service
        self._state = service.state

    def info(self, meta: K.GroupMeta, rt: GroupRuntime | None = None) -> GroupView:
        members: list[tuple[str, list[int]]] = []
        if rt is not None and rt.members is not None:
            with rt.lock:
                members = [(member, list(rt.members.assigned(member))) for member in rt.members.members()]
        return GroupView(meta, members)

    def create(self, topic: str, group: str, config: internal_pb2.GroupConfig) -> GroupView:
        return self.info(self._service.create(topic, group, config))

    def describe(self, topic: str, group: str) -> GroupView:
        self._service.read_barrier()
        rt = self._service.runtime(topic, group)
        return self.info(rt.meta, rt)

    def list_groups(self, topic: str) -> list[GroupView]:
        """The groups of ``topic``; a topic that does not exist is NOT_FOUND (as for DescribeGroup),
        even while groups of a dropped topic wait for it to be re-created."""
        validate_name(topic)
        self._service.read_barrier()
        if self._state.topic(topic) is None:
            raise TopicNotFound(topic)
        return [self.info(meta) for meta in layout.topic_metas(self._state.store, topic)]

    def delete(self, topic: str, group: str) -> None:
        """Delete the group's state (its dead-letter topic stays: drop it like any topic)."""
        validate_name(topic)
        validate_group_name(group)
        self._service.ready()
        meta = layout.get_meta(self._state.store, topic, group)
        gid = meta.group_id if meta is not None else 0
        cmd = K.Command(delete_group=K.DeleteGroupCommand(topic=topic, group=group, group_id=gid))
        raise_rejected(self._service.submit(cmd, topic))
        self._service.forget(topic, group)

    def seek(self, topic: str, group: str, position: internal_pb2.Position,
             partition: int | None) -> list[tuple[int, int]]:
        """Move the group's committed positions (backwards too); acks and retries of those partitions
        are forgotten, dead letters stay. A token seeks its own partition to right after its record."""
        rt = self._service.runtime(topic, group)
        tmeta = self._state.topic(topic)
        if tmeta is None:
            raise TopicNotFound(topic)
        kind = position.WhichOneof("kind")
        if kind == "start" and position.start not in internal_pb2.StartPosition.values():
            raise InvalidArgument(f"unknown start position {position.start}")
        partitions = list(range(rt.meta.partitions)) if partition is None else [partition]
        if kind == "token":
            token = records.PositionToken.decode(position.token)
            if token.incarnation != tmeta.topic_id:
                raise InvalidArgument("the position token is of another incarnation of the topic")
            partitions = [token.partition]
        if any(p >= rt.meta.partitions for p in partitions):
            raise InvalidArgument(f"partition {partitions[0]} does not exist (topic has {rt.meta.partitions})")
        offsets = [self._service.resolve(tmeta, p, position) for p in partitions]
        cmd = K.Command(seek_group=K.SeekGroupCommand(topic=topic, group=group, group_id=rt.gid,
                                                      partitions=partitions, offsets=offsets))
        raise_rejected(self._service.submit(cmd, topic))
        rt.reset_partitions(partitions)
        self._state.notify_change()
        return list(zip(partitions, offsets, strict=True))

    def lag(self, topic: str, group: str) -> GroupLag:
        applied = self._service.read_barrier()
        rt = self._service.runtime(topic, group)
        rows = lag_rows(self._state, rt.meta, self._service.clock.now_ms(), rt)
        return GroupLag(rt.meta.paused, rows, applied, self._service.submitter.self_grpc_address())

    def pause(self, topic: str, group: str, paused: bool) -> list[str]:
        """Pause (or resume) one group, or every group of ``topic`` when ``group`` is empty."""
        validate_name(topic)
        if group:
            validate_group_name(group)
        self._service.ready()
        if self._state.topic(topic) is None and not layout.topic_metas(self._state.store, topic):
            raise TopicNotFound(topic)
        cmd = K.Command(pause_groups=K.PauseGroupsCommand(topic=topic, group=group, paused=paused))
        changed = raise_rejected(self._service.submit(cmd, topic))
        assert isinstance(changed, list)
        return changed

    def mark(self, topic: str, group: str, role: int) -> GroupView:
        """Set the group's prune role (lead, protect or none; SPEC §2.2)."""
        validate_name(topic)
        validate_group_name(group)
        self._service.ready()
        if role not in internal_pb2.PruneRole.values():
            raise InvalidArgument(f"unknown prune role {role}")
        cmd = K.Command(mark_group=K.MarkGroupCommand(topic=topic, group=group, role=role))  # type: ignore[arg-type]
        meta = raise_rejected(self._service.submit(cmd, topic))
        assert isinstance(meta, K.GroupMeta)
        return self.info(meta)

    # -- dead letters --------------------------------------------------------------------------
    def dead_letters(self, topic: str, group: str, limit: int, partition: int | None,
                     after_offset: int | None) -> list[K.DeadLetter]:
        """Up to ``limit`` dead letters in (partition, offset) order, each with a copy of its record
        while the copies total at most :data:`DEAD_RECORDS_BYTES_MAX` bytes (the rest without)."""
        self._service.read_barrier()
        rt = self._service.runtime(topic, group)
        if limit > DEAD_LIMIT_MAX:
            raise InvalidArgument(f"limit must be at most {DEAD_LIMIT_MAX}, got {limit}")
        topic_meta = self._state.topic(topic)
        count = topic_meta.config.partitions if topic_meta is not None else 0
        if partition is not None and partition >= count:  # (and the range scan's end fits its 32 bits)
            raise InvalidArgument(f"partition {partition} does not exist (topic {topic!r} has {count})")
        out = []
        dlq = self._state.topic(rt.meta.dlq_topic)
        copied_bytes = 0
        for p, o, dead in layout.dead_letters(self._state.store, rt.gid, partition, after_offset,
                                              limit or DEFAULT_DEAD_LIMIT):
            item = K.DeadLetter(partition=p, offset=o, attempts=dead.attempts, reason=dead.reason,
                                dead_ms=dead.dead_ms, dlq_partition=dead.dlq_partition, dlq_offset=dead.dlq_offset)
            if dlq is not None and copied_bytes < DEAD_RECORDS_BYTES_MAX:
                self._copy(dlq, dead, item)
                if copied_bytes + item.record.ByteSize() > DEAD_RECORDS_BYTES_MAX:
                    item.ClearField("record")  # over the byte bound: listed without its record
                    copied_bytes = DEAD_RECORDS_BYTES_MAX
                else:
                    copied_bytes += item.record.ByteSize()
            out.append(item)
        return out

    def _copy(self, dlq: K.TopicMeta, dead: K.DeadLetterState, item: K.DeadLetter) -> None:
        start = self._state.partition(dlq.topic_id, dead.dlq_partition).start_offset
        stored = record_log.get(self._state.records_store(dlq.topic_id), dlq.topic_id, dead.dlq_partition,
                                dead.dlq_offset, start)
        if stored is None or stored.error is not None:
            return
        try:
            item.record.MergeFromString(stored.body)
        except DecodeError:
            return
        item.record.topic, item.record.partition, item.record.offset = dlq.config.name, dead.dlq_partition, \
            dead.dlq_offset
        item.record.timestamp_ms = stored.timestamp_ms

    def retry_dead_letters(self, topic: str, group: str, positions: list[tuple[int, int]],
                           everything: bool) -> DeadRetried:
        """Deliver dead letters again (attempts start over). Once the cluster's command format is 3,
        the command carries this leader's start offsets: dead letters whose records were pruned stay
        dead and are counted apart (a retry could only dead-letter them again)."""
        rt = self._service.runtime(topic, group)
        if not everything and not positions:
            raise InvalidArgument("name the dead letters to retry (partition, offset) or ask for all")
        if everything and positions:
            raise InvalidArgument("give either all or the dead letters to retry, not both")
        if len(positions) > POSITIONS_MAX:
            raise InvalidArgument(f"at most {POSITIONS_MAX} dead letters per call, got {len(positions)}")
        beyond = sorted({p for p, _ in positions if p >= rt.meta.partitions})
        if beyond:  # as list and seek answer; an offset that is no dead letter is ignored (the doc says so)
            raise InvalidArgument(f"partition {beyond[0]} does not exist (topic has {rt.meta.partitions})")
        cmd = K.Command(retry_dead_letters=K.RetryDeadLettersCommand(
            topic=topic, group=group, group_id=rt.gid, now_ms=self._service.clock.now_ms(), all=everything,
            partitions=[p for p, _ in positions], offsets=[o for _, o in positions]))
        topic_meta = self._state.topic(topic)
        if self._state.cluster_format >= PRUNED_DEAD_FORMAT and topic_meta is not None:
            cmd.retry_dead_letters.start_offsets[:] = [
                self._state.partition(topic_meta.topic_id, p).start_offset for p in range(rt.meta.partitions)]
            cmd.format = PRUNED_DEAD_FORMAT
        result = raise_rejected(self._service.submit(cmd, topic))
        assert isinstance(result, DeadRetried)
        return result

    def purge_dead_letters(self, topic: str, group: str) -> int:
        rt = self._service.runtime(topic, group)
        cmd = K.Command(purge_dead_letters=K.PurgeDeadLettersCommand(topic=topic, group=group, group_id=rt.gid))
        count = raise_rejected(self._service.submit(cmd, topic))
        assert isinstance(count, int)
        return count

    # -- metrics ---------------------------------------------------------------------------------
    def figures(self) -> list[tuple[str, str, LagRow]]:
        """(topic, group, row) of every partition of every group of a topic that exists, as this node
        knows them. A group outlives a dropped topic (docs/design/groups.md) but has no figures then,
        as ``group lag`` answers NOT_FOUND: its series leave with the topic's, and come back once a
        re-created topic's first group access has rebased it."""
        runtimes = {(rt.meta.topic, rt.meta.group): rt for rt in self._service.runtimes()}
        now = self._service.clock.now_ms()
        out = []
        for meta in layout.all_metas(self._state.store):
            topic = self._state.topic(meta.topic)
            if topic is None or topic.topic_id != meta.topic_id:
                continue
            rt = runtimes.get((meta.topic, meta.group))
            for row in lag_rows(self._state, meta, now, rt if rt is not None and rt.gid == meta.group_id else None):
                out.append((meta.topic, meta.group, row))
        return out
