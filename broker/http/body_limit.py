"""The cap on a request body: read in pieces up to the cap, never whole past it (answered 413).

Without it the gateway read a body of any size (a 150 MB POST took the node from 443 MB to 2 GB of
RSS for good) and left the refusal to gRPC's transport. The cap is derived from the broker's own
publish limits (:func:`body_bytes_max`), so every batch the gRPC API accepts still fits through
HTTP as JSON; past it, the request is refused before its body is read whole: at once on a
``Content-Length`` over the cap, else as soon as the streamed body passes it. The connection stays
usable (uvicorn drops the rest of the body as it arrives), so a client that sends the whole body
before reading the answer still gets the 413 rather than a reset.
"""

from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.http import problems
from broker.http.bodies import PUBLISH_RECORDS_MAX
from broker.limits import Limits

MIB = 1 << 20
# The largest request a node's gRPC server accepts is max_batch_bytes + 1 MiB (``Node.max_message_bytes``:
# the slack holds protobuf framing, keys, headers and idempotency keys beside the record bodies).
GRPC_MESSAGE_SLACK_BYTES = 1 << 20
# The JSON around one record besides its content: field names, quotes, commas, braces and a partition
# number; {"value_b64":"","key":"","partition":2147483647,"headers":{},"idempotency_key":""}, is 85
# bytes, so 256 leaves room for a client's indentation.
RECORD_JSON_FRAMING_BYTES = 256


def body_bytes_max(batch_bytes_max: int) -> int:
    """The body cap that lets through every publish gRPC accepts from a node with ``batch_bytes_max``.

    The whole gRPC message (batch_bytes_max + 1 MiB) as base64 (4 bytes per 3, ``value_b64``; a value
    sent as JSON text or a key or header without escapes takes fewer), plus the JSON framing of the
    most records one HTTP publish may carry (``PUBLISH_RECORDS_MAX``), rounded up to a whole MiB.
    With the default 8 MiB batch: 9 MiB * 4/3 = 12 MiB, + 10,000 * 256 B = 14.44 MiB -> 15 MiB."""
    assert batch_bytes_max > 0, batch_bytes_max
    message_bytes_max = batch_bytes_max + GRPC_MESSAGE_SLACK_BYTES
    exact = -(-message_bytes_max * 4 // 3) + PUBLISH_RECORDS_MAX * RECORD_JSON_FRAMING_BYTES
    cap = -(-exact // MIB) * MIB
    assert cap >= message_bytes_max * 4 / 3, (cap, message_bytes_max)
    return cap


# The gateway reaches whichever node leads and cannot see its config, so it takes the broker's
# default batch limit (broker/limits.py); a cluster run with a larger max_batch_bytes publishes
# batches past this over gRPC.
BODY_BYTES_MAX = body_bytes_max(Limits().batch_bytes_max)


def refusal(bytes_max: int, declared_bytes: int | None = None) -> JSONResponse:
    """The 413 for a body over ``bytes_max`` (``declared_bytes``: its Content-Length, when it had one)."""
    size = "the request body" if declared_bytes is None else f"the request body ({declared_bytes} bytes)"
    return problems.too_large(
        f"{size} is over the gateway's limit of {bytes_max} bytes per request: split the batch into "
        "smaller requests", bytes_max)


async def read_capped(receive: Receive, bytes_max: int) -> bytes | None:
    """The whole body when it is at most ``bytes_max``; None as soon as it passes it (the rest is left
    unread). Raises :class:`ClientDisconnect` when the client goes away before its body ends."""
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > bytes_max:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            body = b"".join(chunks)
            assert len(body) == total <= bytes_max
            return body


class BodyLimit:
    """ASGI middleware: a request whose body is over ``bytes_max`` is answered 413 (problem+json)
    without the body being read whole and without reaching the app; a body within the cap is read
    here and handed to the app in one message (every endpoint reads its body whole anyway)."""

    def __init__(self, app: ASGIApp, bytes_max: int = BODY_BYTES_MAX) -> None:
        assert bytes_max > 0, bytes_max
        self.app = app
        self.bytes_max = bytes_max

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > self.bytes_max:  # refused before a byte of it is read
            await refusal(self.bytes_max, int(declared))(scope, receive, send)
            return
        try:
            body = await read_capped(receive, self.bytes_max)
        except ClientDisconnect:
            return  # nobody to answer
        if body is None:
            await refusal(self.bytes_max)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the client's disconnect, as before
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)
