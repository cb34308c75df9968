"""Leader-side consumer-group operations: runtimes, settling, the data-plane verbs and the ticker.

Everything here runs on the leader only (``NotLeader`` elsewhere, which the services layer turns
into UNAVAILABLE + ``x-leader``). Runtimes (leases, membership) belong to one leader term: when
the term changes they are dropped and rebuilt from the replicated state, so a new leader
re-delivers whatever was in flight (at-least-once) and never anything settled. Every change of
replicated group state goes through one ``Command`` built here and applied by
:mod:`broker.core.groups.apply`; a settle command carries many records (one per ``Ack`` call, and
one per ticker round for all expired leases).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable

from broker.clock import Clock
from broker.core import record_log, records
from broker.core.applied import Rejected
from broker.core.errors import (
    BrokerError,
    FailedPrecondition,
    GroupExists,
    GroupNotFound,
    InvalidArgument,
    ResourceExhausted,
    TopicNotFound,
    Unavailable,
)
from broker.core.groups import layout
from broker.core.groups.apply import GroupApplier, Outcome, SettleResult
from broker.core.groups.config import (
    EXTEND_MAX_MS,
    NACK_DELAY_MAX_MS,
    dlq_topic_name,
    is_stream,
    normalized_group_config,
    validate_delay_ms,
    validate_group_name,
    validate_member_id,
)
from broker.core.state_machine import BrokerStateMachine
from broker.core.topics import TOPICS_MAX, check_topic_count, validate_name
from broker.leader.groups.leases import Lease, Position
from broker.leader.groups.runtime import GroupRuntime
from broker.leader.reading import offset_at_time
from broker.leader.submitter import CommandSubmitter
from broker.v1 import internal_pb2

log = logging.getLogger(__name__)
K = internal_pb2
TICK_S = 0.05
# The ticker's wait while this node holds no group runtime (a follower, or a leader no consumer has used
# yet): it has nothing to expire, and creating a runtime wakes it. At TICK_S an idle node's ticker woke
# 20 times a second for nothing (0.3-0.5 % of a core here).
IDLE_TICK_S = 1.0
# a client's own, of what it received (a release is too: GroupRuntime.confirm_told)
_CLIENT_SETTLES = frozenset((K.SETTLE_ACK, K.SETTLE_NACK, K.SETTLE_DISCARD))
SETTLE_BYTES_MAX = 4 << 20  # one settle command stays well below the replication limit
POSITIONS_MAX = 10_000
REASON_CHARS_MAX = 1024
MEMBERS_MAX = 1024  # members of one stream-mode group (a join walks them: broker/leader/groups/membership.py)


def raise_rejected(result: object) -> object:
    if isinstance(result, Rejected):
        raise result.error
    return result


class GroupService:
    """Consumer groups on top of the replicated state machine (leader side)."""

    def __init__(self, state: BrokerStateMachine, applier: GroupApplier, submitter: CommandSubmitter,
                 clock: Clock, tick_s: float = TICK_S, topics_max: int = TOPICS_MAX,
                 held: Callable[[int], frozenset[int]] = lambda topic_id: frozenset()) -> None:
        """``clock``: the node clock. Its wall reading (``now_ms``) is stamped into commands and
        shown to clients; its monotonic reading times lease deadlines, member sessions and
        revocations, which live only in this leader's memory. ``topics_max``: the node's
        ``max_topics`` (a new group's dead-letter topic counts). ``held``: the partitions of a topic
        (by id) whose `memory` records this node still takes back from the others
        (``MemoryRefill.held``): its groups deliver nothing of them meanwhile."""
        self.topics_max = topics_max
        self.state = state
        self.applier = applier
        self.submitter = submitter
        self.clock = clock
        self._tick_s = tick_s
        self._runtimes: dict[tuple[str, str], GroupRuntime] = {}
        self._held = held
        self._term: int | None = None
        self._lock = threading.Lock()
        self._barrier_lock = threading.Lock()
        self._stop = threading.Event()
        self._work = threading.Event()  # set when a runtime is created (and at stop): the ticker wakes
        self._thread: threading.Thread | None = None

    # -- runtimes ----------------------------------------------------------------------------------
    def ensure_leader(self) -> None:
        self.submitter.ensure_leader()

    def ready(self) -> None:
        """Raise unless this node leads and has applied everything committed before its term."""
        self._check_term()

    def _check_term(self) -> None:
        """Runtimes belong to one leader term. A new leader is reported before it has applied the
        entries committed in earlier terms, so it first replicates a barrier and waits for it:
        reading group state earlier could re-deliver settled records or report a lower watermark."""
        term = self.submitter.leader_term()
        if term == self._term:
            return
        with self._barrier_lock:
            if term == self._term:
                return
            barrier = K.Command(group_barrier=K.GroupBarrierCommand(term=term))
            raise_rejected(self.submitter.submit(barrier))
            with self._lock:
                self._runtimes.clear()
                self._term = term

    def read_barrier(self) -> int:
        """Before reading group state: replicate a no-op and wait until it is applied here, which
        proves this node still leads (a leader cut off from the majority cannot commit it, so it
        fails instead of answering from what it last applied) and that the state includes every
        change committed before the call (Raft's read-index rule, done through the log). Returns the
        applied index the read reflects."""
        self._check_term()
        term = self.submitter.leader_term()
        raise_rejected(self.submitter.submit(K.Command(group_barrier=K.GroupBarrierCommand(term=term))))
        return self.state.applied_index()

    def runtime(self, topic: str, group: str) -> GroupRuntime:
        """The runtime of an existing group on this leader; follows a re-created topic (rebase)."""
        validate_name(topic)
        validate_group_name(group)
        self._check_term()
        current = self.state.topic(topic)
        if current is None:  # first: a group of a topic that does not exist is no answer to give
            raise TopicNotFound(topic)
        meta = layout.get_meta(self.state.store, topic, group)
        if meta is None:
            raise GroupNotFound(topic, group)
        if current.topic_id != meta.topic_id:
            meta = self._rebase(meta, current)
        with self._lock:
            rt = self._runtimes.get((topic, group))
            if rt is None or rt.gid != meta.group_id or rt.gone:
                rt = GroupRuntime(meta, self.state, self.applier, self._held)
                self._runtimes[(topic, group)] = rt
                self._work.set()
        rt.refresh()
        if rt.gone:  # deleted or rebased between our read and the runtime's
            return self.runtime(topic, group)
        return rt

    def runtimes(self) -> list[GroupRuntime]:
        with self._lock:
            return list(self._runtimes.values())

    def forget(self, topic: str, group: str) -> None:
        with self._lock:
            self._runtimes.pop((topic, group), None)

    def submit(self, cmd: K.Command, topic: str) -> object:
        """Replicate a group command of ``topic``: synced like the topic's records when it is an
        ``fsync`` topic, so committed positions survive a power loss as its records do."""
        meta = self.state.topic(topic)
        synced = meta is not None and meta.config.durability == internal_pb2.DURABILITY_FSYNC
        return self.submitter.submit(cmd, sync=synced)

    def _rebase(self, meta: K.GroupMeta, topic: K.TopicMeta) -> K.GroupMeta:
        starts = [self.state.partition(topic.topic_id, p).start_offset for p in range(topic.config.partitions)]
        cmd = K.Command(rebase_group=K.RebaseGroupCommand(topic=meta.topic, group=meta.group, group_id=meta.group_id,
                                                          topic_id=topic.topic_id, start_offsets=starts))
        result = self.submit(cmd, meta.topic)
        if isinstance(result, Rejected) and isinstance(result.error, GroupNotFound):
            fresh = layout.get_meta(self.state.store, meta.topic, meta.group)  # rebased by a concurrent call
            if fresh is not None and fresh.topic_id == topic.topic_id:
                return fresh
        new = raise_rejected(result)
        assert isinstance(new, K.GroupMeta)
        log.info("group %s of %s follows the re-created topic (incarnation %d -> %d)", meta.group, meta.topic,
                 meta.topic_id, topic.topic_id)
        return new

    # -- creation --------------------------------------------------------------------------------
    def create(self, topic: str, group: str, config: internal_pb2.GroupConfig) -> K.GroupMeta:
        """Create a group; its partitions start where ``config.start_from`` resolves now."""
        validate_name(topic)
        validate_group_name(group)
        dlq = dlq_topic_name(topic, group)  # a derived name that would be invalid fails here, not at apply
        normalized = normalized_group_config(config)
        existing_dlq = self.state.topic(dlq)
        if existing_dlq is not None and existing_dlq.config.full_policy == internal_pb2.FULL_POLICY_REJECT:
            # a topic of that name is the group's dead-letter topic (pre-created ones too: their retention
            # applies); but dead letters cannot be refused, so a full one would silently pass its limits
            raise FailedPrecondition(f"topic {dlq!r} would be this group's dead-letter topic, and its full "
                                     "policy is reject: dead letters cannot be refused. Alter it to discard_old "
                                     "or drop it, or name the group otherwise")
        self._check_term()
        meta = self.state.topic(topic)
        if meta is None:
            raise TopicNotFound(topic)
        if meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL:
            raise InvalidArgument("ephemeral topics cannot have consumer groups (nothing is stored to settle)")
        if existing_dlq is None:
            check_topic_count(self.state, self.topics_max, f"group {group!r} would create its dead-letter topic")
        starts = [self.resolve(meta, p, normalized.start_from) for p in range(meta.config.partitions)]
        cmd = K.Command(create_group=K.CreateGroupCommand(topic=topic, topic_id=meta.topic_id, group=group,
                                                          config=normalized, now_ms=self.clock.now_ms(),
                                                          start_offsets=starts))
        created = raise_rejected(self.submit(cmd, topic))
        assert isinstance(created, K.GroupMeta)
        return created

    def ensure(self, topic: str, group: str, config: internal_pb2.GroupConfig) -> GroupRuntime:
        """The group's runtime, creating the group with ``config`` if it does not exist."""
        validate_name(topic)
        validate_group_name(group)
        self._check_term()
        if layout.get_meta(self.state.store, topic, group) is None:
            with contextlib.suppress(GroupExists):  # a concurrent subscriber created it
                self.create(topic, group, config)
        return self.runtime(topic, group)

    def resolve(self, topic: K.TopicMeta, partition: int, position: internal_pb2.Position) -> int:
        """The offset ``position`` designates in one partition now."""
        st = self.state.partition(topic.topic_id, partition)
        lost = self.state.lost_at_start(topic.topic_id, partition)
        first = st.start_offset if lost is None else lost[0]  # from what this node lost: SKIP_FORWARD says so
        kind = position.WhichOneof("kind")
        if kind is None or (kind == "start" and position.start != internal_pb2.START_POSITION_LATEST):
            return first
        if kind == "start":
            return st.end_offset
        if kind == "offset":
            return min(max(position.offset, first), st.end_offset)
        if kind == "timestamp_ms":
            return offset_at_time(self.state, topic.topic_id, partition, position.timestamp_ms)
        token = records.PositionToken.decode(position.token)
        if token.incarnation != topic.topic_id or token.partition != partition:
            return st.start_offset
        return min(token.next_offset, st.end_offset)

    # -- settling --------------------------------------------------------------------------------
    def delivered(self, rt: GroupRuntime, tokens: list[bytes]) -> list[tuple[int, Position, int]]:
        """(index in ``tokens``, position, delivery) of each delivered record's position token of this
        incarnation of the topic (tokens of an older one are dropped: their group state is gone; a
        token of another topic is refused); the delivery is 0 for a token that names none
        (``broker/core/records.py``)."""
        if len(tokens) > POSITIONS_MAX:
            raise InvalidArgument(f"at most {POSITIONS_MAX} positions per call, got {len(tokens)}")
        out: list[tuple[int, Position, int]] = []
        names: dict[int, str] | None = None  # topic ids of the existing topics, read once per call if asked
        for i, raw in enumerate(tokens):
            token = records.PositionToken.decode(raw)
            if token.incarnation != rt.meta.topic_id:
                if names is None:
                    names = {t.topic_id: t.config.name for t in self.state.topics()}
                other = names.get(token.incarnation)
                if other is not None:  # not an older incarnation of this topic: a mix-up of the caller's
                    raise InvalidArgument(f"position {i} is a record of topic {other!r}, not of {rt.meta.topic!r}")
                continue
            if token.partition >= rt.meta.partitions or token.next_offset == 0:
                raise InvalidArgument(f"position of partition {token.partition} offset {token.next_offset - 1} "
                                      f"is not a record of {rt.meta.topic!r}")
            end = rt.bounds(token.partition)[1]
            if token.next_offset > end:  # settled ahead, the record would never be delivered once written
                raise InvalidArgument(f"position {i} (partition {token.partition} offset {token.next_offset - 1}) is "
                                      f"not a record of {rt.meta.topic!r}: the partition ends at offset {end}")
            out.append((i, (token.partition, token.next_offset - 1), token.delivery))
        return out

    @staticmethod
    def told(rt: GroupRuntime, kept: list[tuple[int, Position, int]]) -> list[Position]:
        """The positions of ``kept`` whose settle proves what their own delivery's stream was told
        (:meth:`GroupRuntime.confirm_told`): not those of a delivery whose lease has ended, whose
        position may be leased to another stream now."""
        with rt.lock:
            return [position for _, position, delivery in kept if rt.current(position, delivery)]

    def entry(self, rt: GroupRuntime, kind: int, position: Position, reason: str = "",
              delay_ms: int | None = None) -> K.SettleEntry:
        """A settle entry; NACK, EXPIRE and DISCARD carry the record body (copied if it dies).
        UNAVAILABLE for one of a `memory` record this node lost at its start and still takes back
        (``held``): it would die without its body."""
        p, o = position
        entry = K.SettleEntry(kind=kind, partition=p, offset=o, reason=reason[:REASON_CHARS_MAX])  # type: ignore[arg-type]
        if delay_ms is not None:
            entry.delay_ms = delay_ms
        if kind != K.SETTLE_ACK:
            tid = rt.meta.topic_id
            stored = record_log.get(self.state.records_store(tid), tid, p, o, self.state.partition(tid, p).start_offset)
            if stored is None and p in self._held(tid):  # a record leased from the last leader (audit)
                lost = self.state.lost_at_start(tid, p)
                if lost is not None and lost[0] <= o < lost[1]:  # it would be dead-lettered without its body
                    raise Unavailable(f"partition {p} offset {o} of {rt.meta.topic!r} is a `memory` record this "
                                      "leader is still taking back from the other members: nothing was settled; "
                                      "retry shortly")
            if stored is not None:
                if stored.error is None:
                    entry.body, entry.timestamp_ms = stored.body, stored.timestamp_ms
                else:
                    entry.kind = K.SETTLE_BADMSG
        return entry

    def settle(self, rt: GroupRuntime, entries: list[K.SettleEntry],
               commits: list[tuple[int, int]] | None = None, told: list[Position] | None = None) -> list[Outcome]:
        """Replicate ``entries`` (chunked by size) and forget their leases; returns the outcomes,
        one per entry in order.
        Partitions whose watermark is below the first retained record are committed up to it in
        the same command once a client of the group has received SKIP_FORWARD for the gap: it
        settled or released a record its stream delivered after the event
        (:meth:`GroupRuntime.confirm_told`).
        Not before: an ack of a record leased before a prune, settled before any pick saw the
        prune, or after the event was sent to a connection that then broke, would otherwise move
        the watermark past the pruned records silently (SPEC §3.3); the next pick tells, and a
        settle of what follows the event commits."""
        rt.confirm_told(told if told is not None else
                        [(e.partition, e.offset) for e in entries if e.kind in _CLIENT_SETTLES])
        commits = list(commits or [])
        for p in sorted({e.partition for e in entries}):
            start, _ = rt.bounds(p)
            if rt.cursor(p).committed < start and rt.skip_told(p, start):
                commits.append((p, start))
        outcomes: list[Outcome] = []
        chunk: list[K.SettleEntry] = []
        size = 0
        for entry in entries:
            if chunk and size + entry.ByteSize() > SETTLE_BYTES_MAX:
                outcomes += self._submit_settle(rt, chunk, [])
                chunk, size = [], 0
            chunk.append(entry)
            size += entry.ByteSize()
        outcomes += self._submit_settle(rt, chunk, commits)
        return outcomes

    def _submit_settle(self, rt: GroupRuntime, entries: list[K.SettleEntry],
                       commits: list[tuple[int, int]]) -> list[Outcome]:
        if not entries and not commits:
            return []
        cmd = K.Command(group_settle=K.GroupSettleCommand(
            topic=rt.meta.topic, group=rt.meta.group, group_id=rt.gid, now_ms=self.clock.now_ms(), entries=entries,
            commit_partitions=[p for p, _ in commits], commit_offsets=[o for _, o in commits]))
        rt.settle_started()
        try:
            result = raise_rejected(self.submit(cmd, rt.meta.topic))
        except BaseException:
            rt.settle_ended(None)  # nothing was freed: a stream waiting meanwhile waits for the same
            raise
        assert isinstance(result, SettleResult) and len(result.outcomes) == len(entries)
        if rt.settle_ended(entries):
            self.state.notify_change()
        return list(result.outcomes)

    # -- data plane ------------------------------------------------------------------------------
    def ack(self, topic: str, group: str, tokens: list[bytes]) -> int:
        """Settle the records of ``tokens`` for good; returns how many this call settled (a record
        settled before, by an earlier ack or after its lease ran out, is not counted)."""
        return sum(self.ack_each(topic, group, tokens))

    def ack_each(self, topic: str, group: str, tokens: list[bytes]) -> list[bool]:
        """:meth:`ack`, answered per token: whether this call settled its record (False for one
        settled before, a repeat of an earlier token of ``tokens``, or a token of an older
        incarnation of the topic)."""
        rt = self.runtime(topic, group)
        kept = self.delivered(rt, tokens)  # an ack settles the record whichever delivery it names
        outcomes = self.settle(rt, [self.entry(rt, K.SETTLE_ACK, pos) for _, pos, _ in kept], told=self.told(rt, kept))
        settled = [False] * len(tokens)
        for (i, _, _), outcome in zip(kept, outcomes, strict=True):
            settled[i] = outcome is Outcome.SETTLED
        return settled

    def nack(self, topic: str, group: str, tokens: list[bytes], delay_ms: int, release: bool) -> None:
        """Fail delivered records: a retry after ``delay_ms`` (0: the backoff; at most
        ``NACK_DELAY_MAX_MS``), or with ``release`` an immediate redelivery that counts no attempt.
        A record whose lease ran out is left as it is (see :meth:`_failure_counted`), and so is one
        whose token names an earlier delivery than the one holding it now: that delivery is over,
        and the record's current holder is still working on it."""
        validate_delay_ms("delay_ms", delay_ms, NACK_DELAY_MAX_MS)
        rt = self.runtime(topic, group)
        kept = self.delivered(rt, tokens)
        if release:
            with rt.lock:
                current = [pos for _, pos, delivery in kept if rt.current(pos, delivery)]
                rt.confirm_told(current)
                released = rt.release(current)
            if released:
                self.state.notify_change()
            return
        delay = delay_ms if delay_ms > 0 else None
        failed = [(pos, delivery) for _, pos, delivery in kept if not self._failure_counted(rt, pos, delivery)]
        self.settle(rt, [self.entry(rt, K.SETTLE_NACK, pos, "nacked", delay) for pos, _ in failed],
                    told=[pos for pos, _ in failed])

    @staticmethod
    def _failure_counted(rt: GroupRuntime, position: Position, delivery: int) -> bool:
        """Whether the failure of the delivery a nack of ``position`` reports was counted already, or
        is not the record's to count: its lease ran out (an EXPIRE for it is being replicated, or it
        waits for its retry, leased to nobody), or the token names a delivery other than the one
        holding the record now (``delivery``; 0: a token without one). Counting the nack as well
        would make one delivery two failed attempts (a record dead-lettered as "attempt 2 of 2"
        after one delivery) and push its retry back, or fail a record its next holder is working
        on. A token without a delivery, of a record leased again since, fails that lease (the
        leader cannot tell such deliveries apart)."""
        with rt.lock:
            lease = rt.leases.get(position)
            if delivery and (lease is None or lease.delivery != delivery):
                return True
            if lease is not None:
                return lease.expiring
            rt.refresh()  # an EXPIRE applied since this call's first read: its retry entry is known now
            return rt.retry_state(position) is not None

    def discard(self, topic: str, group: str, tokens: list[bytes], reason: str) -> None:
        """Dead-letter delivered records for good (a discard, like an ack, settles the record whichever
        delivery its token names)."""
        rt = self.runtime(topic, group)
        why = f"discarded: {reason}" if reason else "discarded"
        kept = self.delivered(rt, tokens)
        self.settle(rt, [self.entry(rt, K.SETTLE_DISCARD, pos, why) for _, pos, _ in kept], told=self.told(rt, kept))

    def extend(self, topic: str, group: str, tokens: list[bytes], extend_ms: int) -> list[int]:
        """New deadlines of the leases still held, one per token (0 for a position without a lease,
        for a token naming a delivery other than the one holding the record, and for a token of an
        older incarnation of the topic). ``extend_ms`` is the new lease length
        from now (0: the group's visibility timeout), at most ``EXTEND_MAX_MS``; every position is
        checked before any lease changes."""
        validate_delay_ms("extend_ms", extend_ms, EXTEND_MAX_MS)
        rt = self.runtime(topic, group)
        length = extend_ms or rt.meta.config.visibility_timeout_ms
        kept = self.delivered(rt, tokens)
        deadlines = [0] * len(tokens)
        with rt.lock:
            for i, pos, delivery in kept:
                lease = rt.leases.get(pos)
                if lease is None or lease.expiring or (delivery and lease.delivery != delivery):
                    continue  # no lease, or another delivery's: this one is over
                rt.leases.set_deadline(lease, self.clock.monotonic_ms() + length)
                deadlines[i] = self.clock.now_ms() + length  # the client sees wall time
        return deadlines

    def commit(self, topic: str, group: str, partition: int, offset: int) -> None:
        """Stream mode: settle everything below ``offset`` in ``partition`` (never moves backwards).
        A queue-mode group is refused: its records go to any member in any order, so a commit would
        settle records other members hold or that wait for a retry, and their outcome would be lost."""
        rt = self.runtime(topic, group)
        if rt.members is None:
            raise FailedPrecondition(f"group {group!r} is a queue-mode group: settle its records with ack, nack or "
                                     "discard, or move it with a seek (commit is for stream-mode groups)")
        if partition >= rt.meta.partitions:
            raise InvalidArgument(f"partition {partition} does not exist (group has {rt.meta.partitions})")
        end = self.state.partition(rt.meta.topic_id, partition).end_offset
        if offset > end:  # it was settled as if it were the end: a typo would have skipped what comes next
            raise InvalidArgument(f"offset {offset} is past the end of partition {partition} ({end}): commit at "
                                  "most the offset after the last record read")
        self.settle(rt, [], [(partition, offset)])
        if rt.committed_below(partition, offset):  # their streams have room, a handover may go on
            self.state.notify_change()

    def join(self, topic: str, group: str, member_id: str,
             config: internal_pb2.GroupConfig) -> tuple[str, list[int], int]:
        """Register a stream-mode member; returns its id, its partitions now and the session timeout.
        A group that does not exist is created only when ``config`` makes it a stream-mode group (a
        refused join creates nothing)."""
        validate_name(topic)
        validate_group_name(group)
        validate_member_id(member_id)
        if layout.get_meta(self.state.store, topic, group) is None and not is_stream(normalized_group_config(config)):
            raise InvalidArgument(f"group {group!r} does not exist and the join's config is queue mode: "
                                  "members of queue-mode groups need not join")
        rt = self.ensure(topic, group, config)
        if rt.members is None:
            raise InvalidArgument(f"group {group!r} is a queue-mode group: members need not join")
        member_id = member_id or f"m-{uuid.uuid4().hex[:12]}"
        with rt.lock:
            self._room_for(rt, group, member_id)
            rt.rejoin(member_id)
            if rt.members.heartbeat(member_id, self.clock.monotonic_ms()):
                self.state.notify_change()
            return member_id, rt.members.assigned(member_id), rt.members.session_timeout_ms

    def heartbeat(self, topic: str, group: str, member_id: str) -> list[int]:
        """Keep a member alive (re-joining it after a failover); returns its partitions now."""
        if not member_id:
            raise InvalidArgument("member_id is required")
        validate_member_id(member_id)
        rt = self.runtime(topic, group)
        if rt.members is None:  # answering OK with no partitions told a caller it was a member of something
            raise InvalidArgument(f"group {group!r} is a queue-mode group: members need not join or beat")
        with rt.lock:
            self._room_for(rt, group, member_id)
            rt.rejoin(member_id)
            if rt.members.heartbeat(member_id, self.clock.monotonic_ms()):
                self.state.notify_change()
            return rt.members.assigned(member_id)

    @staticmethod
    def _room_for(rt: GroupRuntime, group: str, member_id: str) -> None:
        """Refuse a new member past :data:`MEMBERS_MAX` (callers hold ``rt.lock``): each one is
        kept for its session timeout, and fresh ids are free to make."""
        assert rt.members is not None
        if not rt.members.is_member(member_id) and rt.members.count() >= MEMBERS_MAX:
            raise ResourceExhausted(f"group {group!r} has {MEMBERS_MAX} members, the most a stream-mode group "
                                    "takes (each owns partitions; a topic has at most 1024): close the members "
                                    "that are done (they leave at once) or wait for their sessions to end")

    def leave(self, topic: str, group: str, member_id: str) -> None:
        """A member closes: its leases come back for immediate redelivery (no attempt counted),
        its streams get nothing more and, in stream mode, its partitions move now."""
        if not member_id:
            raise InvalidArgument("member_id is required")
        validate_member_id(member_id)
        rt = self.runtime(topic, group)
        with rt.lock:
            if rt.members is not None:
                rt.members.leave(member_id, self.clock.monotonic_ms())
            rt.leave(member_id)
        self.state.notify_change()

    # -- ticker ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="groups-ticker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._work.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while True:
            with self._lock:
                wait_s = self._tick_s if self._runtimes else max(self._tick_s, IDLE_TICK_S)
            self._work.wait(wait_s)
            self._work.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except BrokerError as exc:
                log.debug("group ticker skipped a round: %s", exc)
            except Exception:  # noqa: BLE001 - the ticker must survive to expire later leases
                log.exception("group ticker failed")

    def tick(self) -> None:
        """Expire leases (one EXPIRE settle per group), expire silent members and hand over
        partitions. Only on the leader; a lost leadership drops every runtime."""
        try:
            self._check_term()
        except BrokerError:
            with self._lock:
                self._runtimes.clear()
                self._term = None
            return
        for rt in self.runtimes():
            now = self.clock.monotonic_ms()
            if rt.members is not None:
                self._tick_members(rt, now)
            expired = rt.take_expired(now)
            if not expired:
                continue
            why = f"lease expired (visibility timeout {rt.meta.config.visibility_timeout_ms} ms)"
            entries = [self.entry(rt, K.SETTLE_EXPIRE, lease.position, why) for lease in expired]
            try:
                self.settle(rt, entries)
            except BrokerError:
                rt.unexpire(expired)
                raise

    def _tick_members(self, rt: GroupRuntime, now: int) -> None:
        members = rt.members
        assert members is not None
        with rt.lock:
            dead, freed = members.expire(now)
            moved = members.hand_over(now, lambda p: any(
                lease.member_id == members.owner(p) for lease in rt.leases.of_partition(p)))
            stale: list[Lease] = [lease for member in dead for lease in rt.leases.of_member(member)]
            for p in set(freed) | set(moved):
                stale += [lease for lease in rt.leases.of_partition(p) if lease.member_id != members.owner(p)]
            rt.give_back(stale)
        if dead or freed or moved:
            log.info("group %s of %s: members %s left by timeout, partitions %s moved", rt.meta.group, rt.meta.topic,
                     dead, sorted(set(freed) | set(moved)))
            self.state.notify_change()
