"""Errors the SDK raises, and the one place where a gRPC status becomes one of them.

Every failure a caller can see is a :class:`BrokerError` carrying the gRPC status name
(``code``, e.g. ``"NOT_FOUND"``) and the server's message. Subclasses name the cases a caller
is expected to handle. Errors detected on the client before anything is sent use the same types
(a bad argument is :class:`InvalidArgument` whether the client or the server noticed it).
"""

from __future__ import annotations

import grpc
import grpc.aio

LEADER_METADATA_KEY = "x-leader"
NO_QUORUM_METADATA_KEY = "x-no-quorum"


class BrokerError(Exception):
    """Base of every SDK error: ``code`` is the gRPC status name, ``message`` its details.

    ``after_unknown_outcome`` is True when an earlier attempt of the same call may have taken
    effect (its connection dropped or it timed out) before this error was returned by a retry.
    """

    code: str = "UNKNOWN"

    def __init__(self, code: str, message: str, *, after_unknown_outcome: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.after_unknown_outcome = after_unknown_outcome

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class TopicNotFound(BrokerError):
    """The topic does not exist (NOT_FOUND)."""


class TopicExists(BrokerError):
    """A topic of that name already exists (ALREADY_EXISTS)."""


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


class DuplicateMessageError(BrokerError):
    """A published record repeats the dedup-field values of a stored one; nothing of its batch
    was stored (ALREADY_EXISTS from a publish, SPEC §4)."""


class SchemaMismatchError(FailedPrecondition):
    """A typed topic's stored schema cannot carry its model, or a stored value does not fit the
    model (FAILED_PRECONDITION; see :mod:`broker.client.typed`)."""


class RouteNotFound(BrokerError):
    """The route does not exist (NOT_FOUND)."""


class RouteExists(BrokerError):
    """A route of that name already exists (ALREADY_EXISTS)."""


_BY_CODE: dict[grpc.StatusCode, type[BrokerError]] = {
    grpc.StatusCode.NOT_FOUND: TopicNotFound,
    grpc.StatusCode.ALREADY_EXISTS: TopicExists,
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


def error_from_rpc(err: grpc.RpcError, *, after_unknown_outcome: bool = False) -> BrokerError:
    """The SDK error for a failed gRPC call: the only gRPC status → exception mapping."""
    code = rpc_code(err)
    cls = _BY_CODE.get(code, BrokerError)
    return cls(code.name, rpc_details(err), after_unknown_outcome=after_unknown_outcome)


def invalid_argument(message: str) -> InvalidArgument:
    """An :class:`InvalidArgument` detected by the client before sending anything."""
    return InvalidArgument(grpc.StatusCode.INVALID_ARGUMENT.name, message)
