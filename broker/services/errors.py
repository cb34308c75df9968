"""The one place where core error types become gRPC statuses.

A status carries the core error's code and message, and in its details (trailer
``grpc-status-details-bin``, a ``google.rpc.Status``) one ``google.rpc.ErrorInfo``: the error's
:class:`~broker.reasons.Reason`, domain ``raftbroker``, and the names of the resources concerned
as metadata. Clients that only read the code and message see what they saw before.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from broker.core import errors
from broker.reasons import DOMAIN, Reason
from broker.storage import StoreCorruption

log = logging.getLogger(__name__)

LEADER_METADATA_KEY = "x-leader"
NO_QUORUM_METADATA_KEY = "x-no-quorum"  # "1" on an UNAVAILABLE from a node that reaches no majority

_CODES: list[tuple[type[errors.BrokerError], grpc.StatusCode]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.TopicNotFound, grpc.StatusCode.NOT_FOUND),
    (errors.TopicExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.GroupNotFound, grpc.StatusCode.NOT_FOUND),
    (errors.GroupExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.MemberNotFound, grpc.StatusCode.NOT_FOUND),
    (errors.MemberExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.DuplicateMessage, grpc.StatusCode.ALREADY_EXISTS),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.NotLeader, grpc.StatusCode.UNAVAILABLE),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.DataLoss, grpc.StatusCode.DATA_LOSS),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
    (errors.ApplyFailed, grpc.StatusCode.INTERNAL),
]


def status_code(exc: errors.BrokerError) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


Trailers = tuple[tuple[str, str | bytes], ...]


def status_for(exc: Exception) -> tuple[grpc.StatusCode, str, Trailers]:
    """The status code, message and trailing metadata that end a call failing with ``exc``
    (INTERNAL, logged, for anything unexpected): the one mapping of both servers' handlers.
    The trailers always hold the status details with the ErrorInfo (:func:`details_trailer`)."""
    if isinstance(exc, errors.BrokerError):
        trailers: list[tuple[str, str | bytes]] = []
        if isinstance(exc, errors.NotLeader) and exc.leader_address:
            trailers.append((LEADER_METADATA_KEY, exc.leader_address))
        if isinstance(exc, errors.NoQuorum) or (isinstance(exc, errors.NotLeader) and exc.no_quorum):
            trailers.append((NO_QUORUM_METADATA_KEY, "1"))
        code, message = status_code(exc), str(exc)
        metadata = exc.metadata()
        if isinstance(exc, errors.NotLeader) and exc.no_quorum:
            metadata["no_quorum"] = "true"
        return code, message, (*trailers, details_trailer(code, message, exc.reason, metadata))
    if isinstance(exc, StoreCorruption):  # a damaged store file met outside the paths that name the partition
        log.error("store damaged: %s", exc)
        code, message = grpc.StatusCode.DATA_LOSS, f"this node's store is damaged: {exc}; read from another node"
        return code, message, (details_trailer(code, message, Reason.DATA_LOSS, {}),)
    log.exception("internal error", exc_info=exc)
    code, message = grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
    return code, message, (details_trailer(code, message, Reason.INTERNAL, {}),)


def details_trailer(code: grpc.StatusCode, message: str, reason: Reason,
                    metadata: dict[str, str]) -> tuple[str, bytes]:
    """The ``grpc-status-details-bin`` trailer of a status: a ``google.rpc.Status`` with the same
    code and message and one ``google.rpc.ErrorInfo`` (``reason``, domain ``raftbroker``)."""
    info = any_pb2.Any()
    info.Pack(error_details_pb2.ErrorInfo(reason=reason.value, domain=DOMAIN, metadata=metadata))
    status = status_pb2.Status(code=code.value[0], message=message, details=[info])
    key, value = rpc_status.to_status(status).trailing_metadata[0]
    return key, value


def abort(context: grpc.ServicerContext, exc: Exception) -> NoReturn:
    """End the call with the status for ``exc`` (:func:`status_for`)."""
    code, message, trailers = status_for(exc)
    if trailers:
        context.set_trailing_metadata(trailers)
    context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")


F = TypeVar("F", bound=Callable[..., Any])


def unary(method: F) -> F:
    """Wrap a unary servicer method so core errors become statuses."""

    @functools.wraps(method)
    def wrapper(self: object, request: object, context: grpc.ServicerContext) -> object:
        try:
            return method(self, request, context)
        except Exception as exc:  # noqa: BLE001 - mapped to a status in abort()
            abort(context, exc)

    return wrapper  # type: ignore[return-value]


def streaming(method: F) -> F:
    """Wrap a response-streaming servicer method so core errors become statuses."""

    @functools.wraps(method)
    def wrapper(self: object, request: object, context: grpc.ServicerContext) -> Iterator[object]:
        try:
            yield from method(self, request, context)
        except Exception as exc:  # noqa: BLE001 - mapped to a status in abort()
            abort(context, exc)

    return wrapper  # type: ignore[return-value]


async def abort_async(context: grpc.aio.ServicerContext, exc: Exception) -> NoReturn:
    """:func:`abort` for handlers on the asyncio server."""
    code, message, trailers = status_for(exc)
    if trailers:
        context.set_trailing_metadata(trailers)
    await context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")


def unary_async(method: F) -> F:
    """:func:`unary` for an async unary servicer method on the asyncio server."""

    @functools.wraps(method)
    async def wrapper(self: object, request: object, context: grpc.aio.ServicerContext) -> object:
        try:
            return await method(self, request, context)
        except Exception as exc:  # noqa: BLE001 - mapped to a status in abort_async()
            await abort_async(context, exc)

    return wrapper  # type: ignore[return-value]


def streaming_async(method: F) -> F:
    """Wrap an async response-streaming servicer method so core errors become statuses."""

    @functools.wraps(method)
    async def wrapper(self: object, request: object, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[object]:
        try:
            async for item in method(self, request, context):
                yield item
        except Exception as exc:  # noqa: BLE001 - mapped to a status in abort_async()
            await abort_async(context, exc)

    return wrapper  # type: ignore[return-value]
