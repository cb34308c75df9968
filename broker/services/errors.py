"""The one place where core error types become gRPC statuses."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc

from broker.core import errors

log = logging.getLogger(__name__)

LEADER_METADATA_KEY = "x-leader"

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
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unimplemented, grpc.StatusCode.UNIMPLEMENTED),
    (errors.ApplyFailed, grpc.StatusCode.INTERNAL),
]


def status_code(exc: errors.BrokerError) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def abort(context: grpc.ServicerContext, exc: Exception) -> NoReturn:
    """End the call with the status for ``exc`` (INTERNAL, logged, for anything unexpected)."""
    if isinstance(exc, errors.BrokerError):
        if isinstance(exc, errors.NotLeader) and exc.leader_address:
            context.set_trailing_metadata(((LEADER_METADATA_KEY, exc.leader_address),))
        context.abort(status_code(exc), str(exc))
    log.exception("internal error")
    context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")
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
