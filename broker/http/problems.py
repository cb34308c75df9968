"""Errors as RFC 9457 ``application/problem+json``: the gRPC reason, a fitting HTTP status.

The one mapping from the SDK's exception classes (which carry the gRPC status, and the typed
reason where the server sends one) to HTTP. Every rule that produces an error stays in the gRPC
services; the gateway only translates. Statuses: 400 bad input, 401 no valid token, 403 a
permission the token's principal lacks, 404 unknown topic/group/route,
409 exists or duplicate, 412 the state forbids it, 413 too large, 429 back-pressure or a full
topic, 501 not provided, 503 no leader/quorum, 504 deadline; anything else is 502 (the cluster
answered something the gateway does not know), never a bare 500.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.responses import JSONResponse

from broker.client import errors

PROBLEM_JSON = "application/problem+json"
_STATUS: tuple[tuple[type[errors.BrokerError], int], ...] = (
    (errors.InvalidArgument, 400),
    (errors.Unauthenticated, 401),
    (errors.PermissionDenied, 403),
    (errors.NotFound, 404),  # topics, groups, routes, members
    (errors.AlreadyExists, 409),  # the same, and a duplicate message
    (errors.FailedPrecondition, 412),
    (errors.ResourceExhausted, 429),
    (errors.Unimplemented, 501),
    (errors.Unavailable, 503),
    (errors.DeadlineExceeded, 504),
)
# A size limit: the typed reason once the services send one, until then the services' wording.
_TOO_LARGE = re.compile(r"TOO_LARGE|bytes,? (is )?over the limit|too large", re.IGNORECASE)


def status_of(err: errors.BrokerError) -> int:
    for cls, status in _STATUS:
        if isinstance(err, cls):
            if status in (400, 429) and _TOO_LARGE.search(f"{getattr(err, 'reason', '') or ''} {err.message}"):
                return 413
            return status
    return 502


def problem(status: int, title: str, detail: str, reason: str, **extra: Any) -> JSONResponse:
    body = {"type": f"https://raftbroker.dev/problems/{reason.lower()}", "title": title, "status": status,
            "detail": detail, "reason": reason, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON)


def from_error(err: errors.BrokerError) -> JSONResponse:
    """The problem document for an SDK error: ``reason`` is the typed gRPC reason when the server sent
    one (``err.reason``), else the gRPC status name; ``grpc_code`` is always the status name."""
    reason = getattr(err, "reason", None) or err.code
    extra: dict[str, Any] = {"grpc_code": err.code}
    if err.after_unknown_outcome:
        extra["after_unknown_outcome"] = True
    return problem(status_of(err), err.code.replace("_", " ").capitalize(), err.message, reason, **extra)
