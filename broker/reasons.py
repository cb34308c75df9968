"""The machine-readable reasons of the broker's errors, shared by the server and the SDK.

Every error the server returns carries one of these as the ``reason`` of a
``google.rpc.ErrorInfo`` (domain :data:`DOMAIN`) in the status details
(``grpc-status-details-bin``), with the names of the resources concerned in its ``metadata``
(``topic``, ``group``, ``route``, ``node_id``, ``leader``). The server's core errors name their
reason (``broker.core.errors``; ``broker.services.errors`` puts it on the wire) and the SDK maps it
back to an exception class (``broker.client.errors``). A reason is never renamed: clients of
other versions rely on it. This module imports nothing of the broker, so both sides may use it.
"""

from __future__ import annotations

import enum

DOMAIN = "raftbroker"


class Reason(enum.StrEnum):
    """Why a request failed; the gRPC status code is coarser (several reasons share one)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    # INVALID_ARGUMENT: a producer-session batch does not continue its session (its first_msg_id is
    # past the session's watermark + 1, e.g. after a reset or a re-created topic); nothing was stored
    SESSION_OUT_OF_SEQUENCE = "SESSION_OUT_OF_SEQUENCE"
    TOPIC_NOT_FOUND = "TOPIC_NOT_FOUND"
    TOPIC_EXISTS = "TOPIC_EXISTS"
    GROUP_NOT_FOUND = "GROUP_NOT_FOUND"
    GROUP_EXISTS = "GROUP_EXISTS"
    ROUTE_NOT_FOUND = "ROUTE_NOT_FOUND"
    ROUTE_EXISTS = "ROUTE_EXISTS"
    MEMBER_NOT_FOUND = "MEMBER_NOT_FOUND"
    MEMBER_EXISTS = "MEMBER_EXISTS"
    NOT_FOUND = "NOT_FOUND"  # some other named thing
    ALREADY_EXISTS = "ALREADY_EXISTS"  # some other named thing
    DUPLICATE_MESSAGE = "DUPLICATE_MESSAGE"  # a publish repeats stored dedup-field values (SPEC §4)
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    NOT_LEADER = "NOT_LEADER"  # metadata ``leader``: the leader's address when known
    NO_QUORUM = "NO_QUORUM"
    UNAVAILABLE = "UNAVAILABLE"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DATA_LOSS = "DATA_LOSS"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    APPLY_FAILED = "APPLY_FAILED"
    INTERNAL = "INTERNAL"
    # UNAUTHENTICATED: the token an open stream (Subscribe, PublishStream) was opened with no longer
    # authenticates its principal (removed from the tokens file, expired, or now another principal's).
    # Nothing of the refused step was done: open a new stream with the current token (the SDK does, once;
    # a token that was revoked is then refused as the stream opens)
    STREAM_REAUTHENTICATE = "STREAM_REAUTHENTICATE"
    # RESOURCE_EXHAUSTED, given by the SDK (gRPC's own refusal of a message over a size limit carries
    # no ErrorInfo): the request is over the node's or the client's limit per gRPC message, and
    # nothing was done (metadata ``size_bytes``, ``limit_bytes``); or the answer is over the client's
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    ANSWER_TOO_LARGE = "ANSWER_TOO_LARGE"


# A definite refusal: nothing was changed and the same request would be refused again (a caller
# records it as failed; retrying cannot help). Anything else may be transient or of unknown outcome.
REFUSALS = frozenset({
    Reason.INVALID_ARGUMENT, Reason.SESSION_OUT_OF_SEQUENCE, Reason.TOPIC_NOT_FOUND, Reason.TOPIC_EXISTS,
    Reason.GROUP_NOT_FOUND,
    Reason.GROUP_EXISTS, Reason.ROUTE_NOT_FOUND, Reason.ROUTE_EXISTS, Reason.MEMBER_NOT_FOUND, Reason.MEMBER_EXISTS,
    Reason.NOT_FOUND, Reason.ALREADY_EXISTS, Reason.DUPLICATE_MESSAGE, Reason.FAILED_PRECONDITION,
    Reason.REQUEST_TOO_LARGE,
})

# A refusal of the records themselves (not of where they go): a copier skips such a record
# instead of retrying it (a route's router, SPEC §3.4).
RECORD_REFUSALS = frozenset({Reason.INVALID_ARGUMENT, Reason.DUPLICATE_MESSAGE})


def reason_of(exc: BaseException) -> str:
    """The reason an error names (a core error or an SDK error), ``""`` when it names none."""
    reason = getattr(exc, "reason", "")
    return reason if isinstance(reason, str) else ""


def refused_records(exc: BaseException) -> bool:
    """True when ``exc`` refuses the records themselves (:data:`RECORD_REFUSALS`)."""
    return reason_of(exc) in RECORD_REFUSALS
