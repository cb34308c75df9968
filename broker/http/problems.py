"""Errors as RFC 9457 ``application/problem+json``: the gRPC reason, a fitting HTTP status.

The one mapping from the SDK's exception classes (which carry the gRPC status, and the typed
reason where the server sends one) to HTTP. Every rule that produces an error stays in the gRPC
services; the gateway only translates. Statuses: 400 bad input, 401 no valid token, 403 a
permission the token's principal lacks, 404 unknown topic/group/route,
409 exists or duplicate, 412 the state forbids it, 413 too large, 429 back-pressure or a full
topic, 501 not provided, 503 no leader/quorum, 504 deadline; anything else is 502 (the cluster
answered something the gateway does not know), never a bare 500.

A gRPC message over a size limit is RESOURCE_EXHAUSTED with gRPC's transport text; that is not
back-pressure (a client told 429 retries the same request forever), so a request's is a 413 and an
answer's a 502, each in our words with the limit in bytes (:func:`from_error`). Every 413 is the
same problem (:func:`too_large`: reason ``REQUEST_TOO_LARGE``, title "Request too large",
``limit_bytes``), the services' own refusal of a record or batch over their limits too (before, it
kept the title and type of ``INVALID_ARGUMENT`` under its 413 status); ``grpc_code`` keeps the
gRPC status.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.responses import JSONResponse

from broker.client import errors
from broker.reasons import Reason

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
TOO_LARGE_REASON = "REQUEST_TOO_LARGE"
# The limit in the services' refusal: "record 0 is 2097166 bytes, over the limit of 1048576 bytes".
_LIMIT_BYTES = re.compile(r"over the limit of (\d+) bytes")


def _message_size(err: errors.BrokerError) -> tuple[bool, int, int] | None:
    """(the request's, its size, the limit) for a gRPC message-size error (as the SDK tells it, or in
    gRPC's text), else None."""
    if not isinstance(err, errors.ResourceExhausted):
        return None
    if err.reason in (Reason.REQUEST_TOO_LARGE, Reason.ANSWER_TOO_LARGE):
        return (err.reason == Reason.REQUEST_TOO_LARGE, int(err.metadata.get("size_bytes", 0)),
                int(err.metadata.get("limit_bytes", 0)))
    found = errors.message_size(err.message)
    return None if found is None else (found[0] != "answer", found[1], found[2])


def status_of(err: errors.BrokerError) -> int:
    size = _message_size(err)
    if size is not None:
        return 413 if size[0] else 502
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


def too_large(detail: str, limit_bytes: int | None, **extra: Any) -> JSONResponse:
    """The 413 of a request over a size limit: ``detail`` says which limit and what to do, and
    ``limit_bytes`` gives the limit as a number (None: the refusal did not say it)."""
    assert limit_bytes is None or limit_bytes > 0, limit_bytes
    if limit_bytes is not None:
        extra["limit_bytes"] = limit_bytes
    return problem(413, "Request too large", detail, TOO_LARGE_REASON, **extra)


def from_error(err: errors.BrokerError) -> JSONResponse:
    """The problem document for an SDK error: ``reason`` is the typed gRPC reason when the server sent
    one (``err.reason``), else the gRPC status name; ``grpc_code`` is always the status name. A 413
    is :func:`too_large`'s (a typed reason other than the status name goes in ``grpc_reason``); a
    gRPC message-size error is told in our words, never in gRPC's transport text (see the module)."""
    reason = getattr(err, "reason", None) or err.code
    extra: dict[str, Any] = {"grpc_code": err.code}
    if err.after_unknown_outcome:
        extra["after_unknown_outcome"] = True
    size = _message_size(err)
    if size is not None:
        request, size_bytes, limit_bytes = size
        if request:
            return too_large(f"the request is {size_bytes} bytes as one gRPC message, over the cluster's limit of "
                             f"{limit_bytes} bytes per message: split the batch into smaller ones", limit_bytes,
                             **extra)
        return problem(502, "Answer too large", f"the cluster's answer is {size_bytes} bytes, over the gateway's "
                       f"limit of {limit_bytes} bytes per gRPC message: ask for less at a time", "ANSWER_TOO_LARGE",
                       limit_bytes=limit_bytes, **extra)
    status = status_of(err)
    if status == 413:  # the services' refusal of a record or batch over their limits: a 413 like the others
        limit = _LIMIT_BYTES.search(err.message)
        if reason != err.code:
            extra["grpc_reason"] = reason
        return too_large(err.message, int(limit.group(1)) if limit else None, **extra)
    return problem(status, err.code.replace("_", " ").capitalize(), err.message, reason, **extra)


def body_of(err: BaseException) -> dict[str, Any]:
    """The problem document of ``err`` as a dict (an SSE ``error`` event's data): an SDK error's as
    :func:`from_error` makes it, anything else a 502 ``STREAM_FAILED``."""
    if isinstance(err, errors.BrokerError):
        body: dict[str, Any] = json.loads(bytes(from_error(err).body))
        return body
    return {"type": "https://raftbroker.dev/problems/stream_failed", "title": "Stream failed", "status": 502,
            "detail": f"the stream failed: {type(err).__name__}: {err}"[:1000], "reason": "STREAM_FAILED"}


# Every status an operation may answer with a problem document, as the OpenAPI document lists them
# (:func:`document_problems`); 401/403 only where the nodes check tokens, 501/504 rarely.
DOCUMENTED = {
    "400": "Invalid input: the body, a parameter or a value the services refuse (`reason` says which rule)",
    "401": "No valid token (when the nodes check tokens)",
    "403": "The token's principal lacks the permission (named in `detail`)",
    "404": "Unknown topic, group or route (or path)",
    "409": "Exists already (another config), or a duplicate message",
    "412": "The cluster's state forbids it (e.g. a claim of a stream-mode group, a prune a group protects)",
    "413": "Request too large (`limit_bytes`)",
    "415": "The body is not `application/json`",
    "429": "Back-pressure, or a full topic with `full_policy=reject`",
    "502": "The cluster answered something the gateway does not know, or an answer too large",
    "503": "No leader or no quorum (retry later)",
    "504": "Deadline exceeded",
}
PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem", "type": "object", "description": "RFC 9457 problem details",
    "required": ["type", "title", "status", "detail", "reason"],
    "properties": {
        "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
        "detail": {"type": "string"},
        "reason": {"type": "string", "description": "the typed gRPC reason, else the gRPC status name"},
        "grpc_code": {"type": "string", "description": "the gRPC status name (errors of the cluster)"},
        "limit_bytes": {"type": "integer", "description": "413: the limit passed"},
        "after_unknown_outcome": {"type": "boolean",
                                  "description": "an earlier attempt of this request may have been applied"},
    },
}


def document_problems(schema: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document as the gateway answers: FastAPI lists a 422 ``HTTPValidationError``
    for every operation with parameters, which this gateway never sends (a refused body or
    parameter is a 400 problem document); here every operation lists the problem statuses instead."""
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status, description in DOCUMENTED.items():
                responses.setdefault(status, {"description": description,
                                              "content": {PROBLEM_JSON: {"schema": problem_ref}}})
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Problem"] = PROBLEM_SCHEMA
    return schema
