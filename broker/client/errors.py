"""Errors the SDK raises, and the one place where a gRPC status becomes one of them.

Every failure a caller can see is a :class:`BrokerError` carrying the gRPC status name
(``code``, e.g. ``"NOT_FOUND"``), the server's message, and the machine-readable ``reason`` the
server put in the status details (a ``google.rpc.ErrorInfo``, see :mod:`broker.reasons`) with its
``metadata`` (the names of the resources concerned). Subclasses name the cases a caller is
expected to handle; the class comes from the reason (:data:`_BY_REASON`, the one table), or from
the code when the status carries no reason (an error of the transport, or an older server).
Errors detected on the client before anything is sent use the same types (a bad argument is
:class:`InvalidArgument` whether the client or the server noticed it).
"""

from __future__ import annotations

import re

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from broker.reasons import DOMAIN, REFUSALS, Reason

LEADER_METADATA_KEY = "x-leader"
NO_QUORUM_METADATA_KEY = "x-no-quorum"
_DETAILS_KEY = "grpc-status-details-bin"  # grpc_status.rpc_status's trailer of the google.rpc.Status


class BrokerError(Exception):
    """Base of every SDK error: ``code`` is the gRPC status name, ``message`` its details.

    ``after_unknown_outcome`` is True when an earlier attempt of the same call may have taken
    effect (its connection dropped or it timed out) before this error was returned by a retry.
    """

    code: str = "UNKNOWN"

    def __init__(self, code: str, message: str, *, after_unknown_outcome: bool = False, reason: str = "",
                 metadata: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.after_unknown_outcome = after_unknown_outcome
        self.reason = reason
        self.metadata = dict(metadata or {})

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"

    @property
    def refused(self) -> bool:
        """True when the server definitely refused the request: nothing was changed and the same
        request would be refused again (:data:`broker.reasons.REFUSALS`; without a reason, by the
        code). False when an earlier attempt of the call may have taken effect."""
        if self.after_unknown_outcome:
            return False
        return self.reason in REFUSALS if self.reason else self.code in _REFUSED_CODES


class NotFound(BrokerError):
    """A named thing does not exist (NOT_FOUND); subclasses say which kind."""


class AlreadyExists(BrokerError):
    """A named thing already exists (ALREADY_EXISTS); subclasses say which kind."""


class TopicNotFound(NotFound):
    """The topic does not exist (NOT_FOUND, reason ``TOPIC_NOT_FOUND``)."""


class TopicExists(AlreadyExists):
    """A topic of that name already exists (ALREADY_EXISTS, reason ``TOPIC_EXISTS``)."""


class GroupNotFound(TopicNotFound):
    """The consumer group does not exist (NOT_FOUND, reason ``GROUP_NOT_FOUND``); a
    :class:`TopicNotFound` for old handlers."""


class GroupExists(TopicExists):
    """A group of that name already exists on the topic (ALREADY_EXISTS, reason ``GROUP_EXISTS``);
    a :class:`TopicExists` for old handlers."""


class MemberNotFound(NotFound):
    """The node is not a member of the cluster (NOT_FOUND, reason ``MEMBER_NOT_FOUND``)."""


class MemberExists(AlreadyExists):
    """The node id or Raft address belongs to another member (ALREADY_EXISTS, reason ``MEMBER_EXISTS``)."""


class InvalidArgument(BrokerError):
    """The request is malformed or breaks a limit; nothing was changed (INVALID_ARGUMENT)."""


class Unavailable(BrokerError):
    """No leader could be reached, or it had no quorum, within the retry deadline (UNAVAILABLE)."""


class ResourceExhausted(BrokerError):
    """Back-pressure or a full topic with ``full_policy=reject`` (RESOURCE_EXHAUSTED)."""


class Unimplemented(BrokerError):
    """The server does not provide this RPC yet (UNIMPLEMENTED)."""


class DeadlineExceeded(BrokerError):
    """The call did not finish within its timeout; its outcome is unknown (DEADLINE_EXCEEDED)."""


class FailedPrecondition(BrokerError):
    """The cluster's state forbids the request (FAILED_PRECONDITION), e.g. a prune a protecting group
    refuses or a route that would close a cycle; nothing was changed."""


class SessionOutOfSequence(InvalidArgument):
    """A producer-session batch does not continue its session (INVALID_ARGUMENT, reason
    ``SESSION_OUT_OF_SEQUENCE``): its first message id is past the session's watermark + 1, e.g.
    after ``reset_watermark`` or a re-created topic. Nothing was stored. The client's own
    sessions recover from it by themselves (a new session, the same records)."""


class DuplicateMessageError(AlreadyExists):
    """A published record repeats the dedup-field values of a stored one; nothing of its batch
    was stored (ALREADY_EXISTS, reason ``DUPLICATE_MESSAGE``, SPEC §4)."""


class SchemaMismatchError(FailedPrecondition):
    """A typed topic's stored schema cannot carry its model, or a stored value does not fit the
    model (FAILED_PRECONDITION; see :mod:`broker.client.typed`)."""


class RouteNotFound(NotFound):
    """The route does not exist (NOT_FOUND, reason ``ROUTE_NOT_FOUND``)."""


class RouteExists(AlreadyExists):
    """A route of that name already exists (ALREADY_EXISTS, reason ``ROUTE_EXISTS``)."""


class Unauthenticated(BrokerError):
    """No valid credentials: a missing, unknown or expired token (UNAUTHENTICATED)."""


class PermissionDenied(BrokerError):
    """The principal lacks the permission the message names (PERMISSION_DENIED)."""


# The one reason -> exception table. Reasons missing here (NOT_LEADER, UNAVAILABLE, INTERNAL, ...)
# take the class of their code.
_BY_REASON: dict[str, type[BrokerError]] = {
    Reason.INVALID_ARGUMENT: InvalidArgument,
    Reason.SESSION_OUT_OF_SEQUENCE: SessionOutOfSequence,
    Reason.TOPIC_NOT_FOUND: TopicNotFound,
    Reason.TOPIC_EXISTS: TopicExists,
    Reason.GROUP_NOT_FOUND: GroupNotFound,
    Reason.GROUP_EXISTS: GroupExists,
    Reason.ROUTE_NOT_FOUND: RouteNotFound,
    Reason.ROUTE_EXISTS: RouteExists,
    Reason.MEMBER_NOT_FOUND: MemberNotFound,
    Reason.MEMBER_EXISTS: MemberExists,
    Reason.NOT_FOUND: NotFound,
    Reason.ALREADY_EXISTS: AlreadyExists,
    Reason.DUPLICATE_MESSAGE: DuplicateMessageError,
    Reason.FAILED_PRECONDITION: FailedPrecondition,
    Reason.NO_QUORUM: Unavailable,
    Reason.NOT_LEADER: Unavailable,
    Reason.UNAVAILABLE: Unavailable,
    Reason.RESOURCE_EXHAUSTED: ResourceExhausted,
    Reason.REQUEST_TOO_LARGE: ResourceExhausted,
    Reason.ANSWER_TOO_LARGE: ResourceExhausted,
    Reason.UNIMPLEMENTED: Unimplemented,
}

# Without a reason: the statuses that refuse a request for good (:attr:`BrokerError.refused`).
_REFUSED_CODES = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "FAILED_PRECONDITION",
                            "PERMISSION_DENIED", "UNAUTHENTICATED", "OUT_OF_RANGE"})

_BY_CODE: dict[grpc.StatusCode, type[BrokerError]] = {
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
}


def _is_call(err: grpc.RpcError) -> bool:
    """True for a failed call that carries a status: a sync ``grpc.Call`` or an asyncio ``AioRpcError``."""
    return isinstance(err, grpc.Call | grpc.aio.AioRpcError)


def rpc_code(err: grpc.RpcError) -> grpc.StatusCode:
    """The status code of a failed call (UNKNOWN if the error carries none)."""
    code = err.code() if _is_call(err) else None
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def rpc_details(err: grpc.RpcError) -> str:
    details = err.details() if _is_call(err) else None
    return details or str(err)


def leader_hint(err: grpc.RpcError) -> str | None:
    """The ``x-leader`` address a follower attached to its refusal, if any."""
    if not _is_call(err):
        return None
    for key, value in err.trailing_metadata() or ():
        if key == LEADER_METADATA_KEY and value:
            return value if isinstance(value, str) else value.decode()
    return None


def says_no_quorum(err: grpc.RpcError) -> bool:
    """True when a node refused because it reaches no majority (the ``x-no-quorum`` trailer; a
    redirect may carry it too: the leader named by a node without a quorum may be gone)."""
    if not _is_call(err) or rpc_code(err) is not grpc.StatusCode.UNAVAILABLE:
        return False
    return any(key == NO_QUORUM_METADATA_KEY for key, _ in err.trailing_metadata() or ())


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The ``google.rpc.ErrorInfo`` of domain ``raftbroker`` in a failed call's status details
    (the ``grpc-status-details-bin`` trailer, a ``google.rpc.Status``), if any. Works for the
    errors of sync and ``grpc.aio`` calls alike (both have ``trailing_metadata()``)."""
    trailing = getattr(err, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            status = status_pb2.Status.FromString(value)
        except DecodeError:  # unreadable details: the code alone decides
            return None
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            if detail.Is(info.DESCRIPTOR) and detail.Unpack(info) and info.domain == DOMAIN:
                return info
    return None


# gRPC's own refusal of a message over a size limit (no ErrorInfo): "SERVER: Received message larger
# than max (10800142 vs. 9437184)" when the node refuses the request, "CLIENT: Sent ..." when this
# client's channel does, "CLIENT: Received ..." when the node's answer is over the channel's limit.
_GRPC_MESSAGE_SIZE = re.compile(r"(?:(CLIENT|SERVER): )?(Sent|Received) message larger than max \((\d+) vs\. (\d+)\)")


def message_size(details: str) -> tuple[str, int, int] | None:
    """(whose limit: ``"node"``, ``"client"`` or ``"answer"``, size, limit) when ``details`` is gRPC's
    refusal of a message over a size limit, else None."""
    found = _GRPC_MESSAGE_SIZE.search(details)
    if found is None:
        return None
    side, direction, size, limit = found.groups()
    whose = "answer" if side == "CLIENT" and direction == "Received" else "client" if side == "CLIENT" else "node"
    return whose, int(size), int(limit)


def _size_error(details: str, after_unknown_outcome: bool) -> ResourceExhausted | None:
    """gRPC's message-size refusal in our words, with a reason (it carries none)."""
    found = message_size(details)
    if found is None:
        return None
    whose, size, limit = found
    metadata = {"size_bytes": str(size), "limit_bytes": str(limit)}
    if whose == "answer":
        return ResourceExhausted("RESOURCE_EXHAUSTED", f"the answer is {size} bytes as one gRPC message, over this "
                                 f"client's limit of {limit} bytes per message: ask for less at a time",
                                 after_unknown_outcome=after_unknown_outcome, reason=Reason.ANSWER_TOO_LARGE,
                                 metadata=metadata)
    return ResourceExhausted("RESOURCE_EXHAUSTED", f"the request is {size} bytes as one gRPC message, over "
                             f"{'this client' if whose == 'client' else 'the node'}'s limit of {limit} bytes per "
                             "message: split the batch into smaller ones", after_unknown_outcome=after_unknown_outcome,
                             reason=Reason.REQUEST_TOO_LARGE, metadata=metadata)


def error_from_rpc(err: grpc.RpcError, *, after_unknown_outcome: bool = False) -> BrokerError:
    """The SDK error for a failed gRPC call: the only gRPC status → exception mapping (by the
    ErrorInfo's reason, else by the code; gRPC's own message-size refusal is told in our words)."""
    code = rpc_code(err)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        sized = _size_error(rpc_details(err), after_unknown_outcome)
        if sized is not None:
            return sized
    info = error_info(err)
    reason = info.reason if info is not None else ""
    cls = _BY_REASON.get(reason) or _BY_CODE.get(code, BrokerError)
    return cls(code.name, rpc_details(err), after_unknown_outcome=after_unknown_outcome, reason=reason,
               metadata=dict(info.metadata) if info is not None else None)


def gave_up(message: str, last: grpc.RpcError, *, after_unknown_outcome: bool = False) -> Unavailable:
    """The :class:`Unavailable` of a call that ran out of retries, with the reason and metadata of
    the ``last`` answer (none when no node answered)."""
    info = error_info(last)
    return Unavailable("UNAVAILABLE", message, after_unknown_outcome=after_unknown_outcome,
                       reason=info.reason if info is not None else "",
                       metadata=dict(info.metadata) if info is not None else None)


def invalid_argument(message: str) -> InvalidArgument:
    """An :class:`InvalidArgument` detected by the client before sending anything."""
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT.name, message)
