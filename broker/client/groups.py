"""Consumer-group administration for :class:`broker.client.Client` (SPEC §3.2): ``client.groups``.

Every call goes to the leader (the only node that knows in-flight leases), following redirects
and retrying on failover like every other call. Writes are idempotent in effect (a retried
seek/pause/retry finds the same state), so retries are safe. Each call is built (and its answer
read) by a plain function here (``*_call``, :mod:`broker.client.calls`) that the asyncio SDK's
``AsyncClient.groups`` (:mod:`broker.client.aio.groups`) runs too.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass

from broker.client import checks, wire
from broker.client.calls import AdminCall, nothing
from broker.client.errors import GroupNotFound, invalid_argument
from broker.client.models import Record
from broker.client.routing import Router
from broker.v1 import admin_pb2, common_pb2

MODES = ("queue", "stream")
PRUNE_ROLES = {"none": common_pb2.PRUNE_ROLE_NONE, "lead": common_pb2.PRUNE_ROLE_LEAD,
               "protect": common_pb2.PRUNE_ROLE_PROTECT}
BACKOFFS = ("fixed", "exponential")
_CONFIG_FIELDS = ("visibility_timeout_ms", "base_delay_ms", "max_delay_ms", "max_attempts", "session_timeout_ms",
                  "max_pending")
_CONFIG_MAX = {"max_attempts": checks.UINT32_MAX, "max_pending": checks.UINT32_MAX}  # the others are int64


@dataclass(frozen=True)
class GroupInfo:
    """A group's configuration as stored, and (stream mode) its members and their partitions."""

    topic: str
    group: str
    mode: str
    paused: bool
    dlq_topic: str
    incarnation: int
    created_ms: int
    visibility_timeout_ms: int
    backoff: str
    base_delay_ms: int
    max_delay_ms: int
    max_attempts: int
    ordered: bool
    session_timeout_ms: int
    max_pending: int
    members: dict[str, tuple[int, ...]]
    prune_role: str = "none"  # "lead" (may prune up to its position) or "protect" (blocks prunes past it)


@dataclass(frozen=True)
class PartitionLag:
    """One partition of a group: ``lag`` retained records not settled (at or above ``committed``),
    ``in_flight`` leased now, ``retrying`` waiting for a retry, ``dead`` dead letters, ``lag_ms``
    the age of the oldest unsettled record."""

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
    """A group's figures as the leader read them after a read barrier: ``node`` answered, and its
    answer reflects Raft index ``applied_index`` (every change committed before the request)."""

    paused: bool
    partitions: tuple[PartitionLag, ...]
    node: str = ""
    applied_index: int = 0

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    @property
    def lag_seconds(self) -> float:
        return max((p.lag_ms for p in self.partitions), default=0) / 1000


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter: the source position, why and when it died, and its copy in the dead-letter
    topic (``record``, ``None`` once that copy is no longer retained)."""

    partition: int
    offset: int
    attempts: int
    reason: str
    dead_ms: int
    dlq_partition: int
    dlq_offset: int
    record: Record | None


@dataclass(frozen=True)
class DeadLettersRetried:
    """What a retry of dead letters did: ``retried`` went back to delivery (attempts start over);
    ``pruned`` stayed dead because their records were pruned (nothing is left to deliver; purge
    forgets them). ``pruned`` is always 0 before the cluster's command format reaches 3."""

    retried: int
    pruned: int


GROUP_OPTIONS = ("mode", "visibility_timeout_ms", "backoff", "base_delay_ms", "max_delay_ms", "max_attempts",
                 "ordered", "session_timeout_ms", "max_pending")


def group_config(mode: str | None = None, *, visibility_timeout_ms: int | None = None, backoff: str | None = None,
                 base_delay_ms: int | None = None, max_delay_ms: int | None = None, max_attempts: int | None = None,
                 ordered: bool = False, session_timeout_ms: int | None = None, max_pending: int | None = None,
                 start: str | int | bytes | None = None, timestamp_ms: int | None = None,
                 **unknown: object) -> common_pb2.GroupConfig:
    """The wire config of a group (``None``: the server default). ``start``/``timestamp_ms``:
    where a new group starts (as for ``Client.subscribe``); ignored for an existing group. An
    unknown option is InvalidArgument naming it (it was Python's TypeError)."""
    if unknown:
        raise invalid_argument(f"unknown group option(s) {sorted(unknown)}; the options are "
                               f"{', '.join(GROUP_OPTIONS)}")
    config = common_pb2.GroupConfig(ordered=ordered)
    if mode is not None:
        if mode not in MODES:
            raise invalid_argument(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
        config.mode = common_pb2.DELIVERY_MODE_QUEUE if mode == "queue" else common_pb2.DELIVERY_MODE_STREAM
        if mode == "queue" and session_timeout_ms is not None:  # as the server refuses ordered with stream
            raise invalid_argument("session_timeout_ms applies to stream mode: queue-mode members have no "
                                   "sessions (a lease's visibility_timeout_ms bounds a silent member)")
    if backoff is not None:
        if backoff not in BACKOFFS:
            raise invalid_argument(f"unknown backoff {backoff!r}; use one of {', '.join(BACKOFFS)}")
        config.backoff = common_pb2.BACKOFF_FIXED if backoff == "fixed" else common_pb2.BACKOFF_EXPONENTIAL
    values = dict(zip(_CONFIG_FIELDS, (visibility_timeout_ms, base_delay_ms, max_delay_ms, max_attempts,
                                       session_timeout_ms, max_pending), strict=True))
    for name, value in values.items():
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise invalid_argument(f"{name} must be a positive int, got {value!r}")
            setattr(config, name, checks.in_range(value, name, 1, _CONFIG_MAX.get(name, checks.INT64_MAX)))
    if start is not None or timestamp_ms is not None:
        config.start_from.CopyFrom(wire.position(start if start is not None else "earliest", timestamp_ms))
    return config


def group_info(msg: admin_pb2.GroupInfo) -> GroupInfo:
    c = msg.config
    return GroupInfo(
        topic=msg.topic, group=msg.group, mode="stream" if c.mode == common_pb2.DELIVERY_MODE_STREAM else "queue",
        paused=msg.paused, dlq_topic=msg.dlq_topic, incarnation=msg.incarnation, created_ms=msg.created_ms,
        visibility_timeout_ms=c.visibility_timeout_ms,
        backoff="fixed" if c.backoff == common_pb2.BACKOFF_FIXED else "exponential", base_delay_ms=c.base_delay_ms,
        max_delay_ms=c.max_delay_ms, max_attempts=c.max_attempts, ordered=c.ordered,
        session_timeout_ms=c.session_timeout_ms, max_pending=c.max_pending,
        members={m.member_id: tuple(m.partitions) for m in msg.members},
        prune_role=next((name for name, value in PRUNE_ROLES.items() if value == msg.prune_role), "none"))


# -- the calls, shared with the asyncio SDK ---------------------------------------------------------

def create_call(topic: str, group: str, mode: str | None, config: dict[str, object]) -> AdminCall[GroupInfo]:
    request = admin_pb2.CreateGroupRequest(topic=topic, group=group,
                                           config=group_config(mode, **config))  # type: ignore[arg-type]
    return AdminCall("CreateGroup", request, f"create group {group}", group_info)


def describe_call(topic: str, group: str) -> AdminCall[GroupInfo]:
    request = admin_pb2.DescribeGroupRequest(topic=topic, group=group)
    return AdminCall("DescribeGroup", request, f"describe group {group}", group_info, write=False)


def list_call(topic: str) -> AdminCall[list[GroupInfo]]:
    return AdminCall("ListGroups", admin_pb2.ListGroupsRequest(topic=topic), f"list groups of {topic}",
                     lambda response: [group_info(g) for g in response.groups], write=False)


def delete_call(topic: str, group: str) -> AdminCall[None]:
    return AdminCall("DeleteGroup", admin_pb2.DeleteGroupRequest(topic=topic, group=group), f"delete group {group}",
                     nothing)


def seek_call(topic: str, group: str, to: str | int | bytes, timestamp_ms: int | None,
              partition: int | None) -> AdminCall[dict[int, int]]:
    request = admin_pb2.SeekGroupRequest(topic=topic, group=group, to=wire.position(to, timestamp_ms))
    if partition is not None:
        request.partition = checks.in_range(partition, "partition", 0, checks.UINT32_MAX)
    return AdminCall("SeekGroup", request, f"seek group {group}",
                     lambda response: {p.partition: p.offset for p in response.positions})


def group_lag(response: admin_pb2.GroupLagResponse) -> GroupLag:
    return GroupLag(response.paused, tuple(
        PartitionLag(p.partition, p.start_offset, p.end_offset, p.committed, p.lag, p.in_flight, p.retrying,
                     p.dead, p.lag_ms) for p in response.partitions), response.node, response.applied_index)


def lag_call(topic: str, group: str) -> AdminCall[GroupLag]:
    return AdminCall("GroupLag", admin_pb2.GroupLagRequest(topic=topic, group=group), f"lag of group {group}",
                     group_lag, write=False)


def mark_call(topic: str, group: str, role: str) -> AdminCall[GroupInfo]:
    if role not in PRUNE_ROLES:
        raise invalid_argument(f"role must be one of {', '.join(PRUNE_ROLES)}, got {role!r}")
    request = admin_pb2.MarkGroupRequest(topic=topic, group=group, role=PRUNE_ROLES[role])
    return AdminCall("MarkGroup", request, f"mark group {group}", group_info)


def pause_call(topic: str, group: str | None) -> AdminCall[list[str]]:
    """``PauseGroups`` of ``group`` (None: every group of ``topic``); answers the groups changed."""
    return AdminCall("PauseGroups", admin_pb2.PauseGroupsRequest(topic=topic, group=group or ""), f"pause {topic}",
                     lambda response: list(response.groups))


def resume_call(topic: str, group: str | None) -> AdminCall[list[str]]:
    return AdminCall("ResumeGroups", admin_pb2.PauseGroupsRequest(topic=topic, group=group or ""), f"resume {topic}",
                     lambda response: list(response.groups))


def dead_letters_call(topic: str, group: str, limit: int, partition: int | None,
                      after_offset: int | None) -> AdminCall[list[DeadLetter]]:
    request = admin_pb2.ListDeadLettersRequest(topic=topic, group=group,
                                               limit=checks.in_range(limit, "limit", 0, checks.UINT32_MAX))
    if partition is not None:
        request.partition = checks.in_range(partition, "partition", 0, checks.UINT32_MAX)
    if after_offset is not None:
        request.after_offset = checks.in_range(after_offset, "after_offset", 0, checks.UINT64_MAX)
    return AdminCall("ListDeadLetters", request, f"dead letters of {group}", dead_letters, write=False)


def dead_letters(response: admin_pb2.ListDeadLettersResponse) -> list[DeadLetter]:
    return [DeadLetter(d.partition, d.offset, d.attempts, d.reason, d.dead_ms, d.dlq_partition, d.dlq_offset,
                       wire.record(d.record) if d.HasField("record") else None) for d in response.dead_letters]


def retry_call(topic: str, group: str, messages: Sequence[tuple[int, int]]) -> AdminCall[DeadLettersRetried]:
    """``RetryDeadLetters`` of ``messages`` ((partition, offset) pairs, checked before anything is sent)."""
    request = admin_pb2.RetryDeadLettersRequest(topic=topic, group=group, messages=[
        admin_pb2.PartitionOffset(partition=checks.in_range(p, "a dead letter's partition", 0, checks.UINT32_MAX),
                                  offset=checks.in_range(o, "a dead letter's offset", 0, checks.UINT64_MAX))
        for p, o in messages])
    return _retry(request)


def retry_all_call(topic: str, group: str) -> AdminCall[DeadLettersRetried]:
    return _retry(admin_pb2.RetryDeadLettersRequest(topic=topic, group=group, all=True))


def _retry(request: admin_pb2.RetryDeadLettersRequest) -> AdminCall[DeadLettersRetried]:
    return AdminCall("RetryDeadLetters", request, f"retry {request.group}",
                     lambda done: DeadLettersRetried(int(done.retried), int(done.pruned)))


def purge_call(topic: str, group: str) -> AdminCall[int]:
    return AdminCall("PurgeDeadLetters", admin_pb2.PurgeDeadLettersRequest(topic=topic, group=group),
                     f"purge {group}", lambda response: int(response.purged))


class Groups:
    """``client.groups``: create, describe, seek/replay, lag, pause/resume, dead letters, delete."""

    def __init__(self, router: Router) -> None:
        self._router = router

    def create(self, topic: str, group: str, mode: str | None = None, **config: object) -> GroupInfo:
        """Create a group (``mode`` and the other ``group_config`` options; ``start`` or
        ``timestamp_ms`` say where it starts). Raises ``GroupExists`` (ALREADY_EXISTS) if it exists."""
        return self._router.admin_call(create_call(topic, group, mode, config))

    def describe(self, topic: str, group: str) -> GroupInfo:
        return self._router.admin_call(describe_call(topic, group))

    def list(self, topic: str) -> builtins.list[GroupInfo]:
        return self._router.admin_call(list_call(topic))

    def delete(self, topic: str, group: str) -> None:
        """Delete the group's state (its dead-letter topic stays: drop it like any topic)."""
        try:
            self._router.admin_call(delete_call(topic, group))
        except GroupNotFound as err:
            if not err.after_unknown_outcome:
                raise

    def seek(self, topic: str, group: str, to: str | int | bytes = "earliest", *, timestamp_ms: int | None = None,
             partition: int | None = None) -> dict[int, int]:
        """Move the group's committed position (backwards too): ``to`` is "earliest", "latest", an
        offset (in ``partition``, or in each), a record's ``position`` token (right after that
        record), or give ``timestamp_ms``. Acks and pending retries of the moved partitions are
        forgotten, dead letters stay. Returns the new committed offset per partition."""
        return self._router.admin_call(seek_call(topic, group, to, timestamp_ms, partition))

    def replay(self, topic: str, group: str, timestamp_ms: int, partition: int | None = None) -> dict[int, int]:
        """Re-deliver everything from ``timestamp_ms`` on (a seek to that time)."""
        return self.seek(topic, group, timestamp_ms=timestamp_ms, partition=partition)

    def lag(self, topic: str, group: str) -> GroupLag:
        return self._router.admin_call(lag_call(topic, group))

    def mark(self, topic: str, group: str, role: str) -> GroupInfo:
        """Set the group's prune role: "lead" (``client.prune(topic, group=...)`` deletes up to its
        committed positions), "protect" (no prune or clear may pass them) or "none"."""
        return self._router.admin_call(mark_call(topic, group, role))

    def pause(self, topic: str, group: str | None = None) -> builtins.list[str]:
        """Stop deliveries to ``group`` (or to every group of ``topic``); returns the groups changed."""
        return self._router.admin_call(pause_call(topic, group))

    def resume(self, topic: str, group: str | None = None) -> builtins.list[str]:
        return self._router.admin_call(resume_call(topic, group))

    def dead_letters(self, topic: str, group: str, *, limit: int = 100, partition: int | None = None,
                     after_offset: int | None = None) -> builtins.list[DeadLetter]:
        """Dead letters in (partition, offset) order; page with ``partition`` + ``after_offset``."""
        return self._router.admin_call(dead_letters_call(topic, group, limit, partition, after_offset))

    def retry_dead_letters(self, topic: str, group: str, messages: Sequence[tuple[int, int]]) -> DeadLettersRetried:
        """Deliver these dead letters ((partition, offset) pairs) again; offsets that are not dead
        letters are ignored, a partition the topic lacks is refused (InvalidArgument). Those whose
        records were pruned stay dead (``pruned``)."""
        return self._router.admin_call(retry_call(topic, group, messages))

    def retry_all_dead_letters(self, topic: str, group: str) -> DeadLettersRetried:
        """Deliver every dead letter of ``group`` again, but those whose records were pruned."""
        return self._router.admin_call(retry_all_call(topic, group))

    def purge_dead_letters(self, topic: str, group: str) -> int:
        """Forget the group's dead letters (their copies stay in the dead-letter topic)."""
        return self._router.admin_call(purge_call(topic, group))
