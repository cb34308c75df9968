"""Unit tests of the gateway's pure parts and of the SDK's reading of asyncio gRPC errors."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import grpc
import grpc.aio
import pytest
from starlette.types import Message, Receive, Scope, Send

from broker.client import errors
from broker.client.routing import Outcome, classify
from broker.http import codec, problems
from broker.http.bodies import PUBLISH_RECORDS_MAX
from broker.http.body_limit import BODY_BYTES_MAX, BodyLimit, body_bytes_max
from broker.limits import ID_CHARS_MAX, Limits

pytestmark = [pytest.mark.unit]


def aio_error(code: grpc.StatusCode, details: str, trailing: tuple[tuple[str, str], ...] = ()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details=details)


def test_asyncio_rpc_errors_are_read_like_sync_ones() -> None:
    redirect = aio_error(grpc.StatusCode.FAILED_PRECONDITION, "not the leader", (("x-leader", "127.0.0.1:7002"),))
    assert classify(redirect) == (Outcome.REDIRECTED, "127.0.0.1:7002")
    no_quorum = aio_error(grpc.StatusCode.UNAVAILABLE, "no quorum", (("x-no-quorum", "1"),))
    assert classify(no_quorum)[0] is Outcome.NO_QUORUM
    assert classify(aio_error(grpc.StatusCode.DEADLINE_EXCEEDED, "slow"))[0] is Outcome.UNKNOWN
    # no ErrorInfo in the status: the class of its code (with one, the reason picks the class)
    err = errors.error_from_rpc(aio_error(grpc.StatusCode.NOT_FOUND, "topic 'x' does not exist"))
    assert isinstance(err, errors.NotFound) and err.message == "topic 'x' does not exist"


def test_cursors_round_trip_and_refuse_garbage() -> None:
    places: dict[int, codec.Place] = {0: b"\x01\x02", 3: 17}
    assert codec.decode_cursor(codec.encode_cursor(places)) == places
    for bad in ("!!!", codec.b64url(b"[1]"), codec.b64url(b'{"x": 1}'), codec.b64url(b'{"-1": 1}'),
                codec.b64url(b'{"0": true}'), codec.b64url(b'{"0": 1e3}'), "a" * (codec.CURSOR_CHARS_MAX + 1)):
        with pytest.raises(errors.InvalidArgument):
            codec.decode_cursor(bad)


def test_values_are_stored_and_shown_as_documented() -> None:
    assert codec.stored_value("text", None, "r") == b"text"
    assert codec.stored_value({"a": [1, 2]}, None, "r") == b'{"a":[1,2]}'
    assert codec.stored_value(None, "AP8=", "r") == b"\x00\xff"
    assert codec.stored_value(None, None, "r") == b"null", "null is a JSON value"
    for value, b64 in ((codec.ABSENT, None), (1, "AA=="), (None, "not base64!")):
        with pytest.raises(errors.InvalidArgument):
            codec.stored_value(value, b64, "r")
    assert codec.shown_value(b'{"a":1}') == {"a": 1}
    assert codec.shown_value(b"plain") == "plain"
    assert codec.shown_value(b"\xff") is None


@pytest.mark.parametrize(("error", "status"), [
    (errors.InvalidArgument("INVALID_ARGUMENT", "bad"), 400),
    (errors.InvalidArgument("INVALID_ARGUMENT", "record 0 is 1048600 bytes, over the limit of 1048576 bytes"), 413),
    (errors.InvalidArgument("INVALID_ARGUMENT", "batch of 9000000 bytes is over the limit of 8388608 bytes"), 413),
    (errors.TopicNotFound("NOT_FOUND", "no"), 404),
    (errors.TopicExists("ALREADY_EXISTS", "yes"), 409),
    (errors.DuplicateMessageError("ALREADY_EXISTS", "dup"), 409),
    (errors.FailedPrecondition("FAILED_PRECONDITION", "protected"), 412),
    (errors.ResourceExhausted("RESOURCE_EXHAUSTED", "full"), 429),
    (errors.ResourceExhausted("RESOURCE_EXHAUSTED", "topic 't' partition 0 is full: 2 records + 1 would pass "
                              "max_records=2 (full_policy=reject)"), 429),
    (errors.ResourceExhausted("RESOURCE_EXHAUSTED", "SERVER: Received message larger than max (10800142 vs. 9437184)"),
     413),
    (errors.ResourceExhausted("RESOURCE_EXHAUSTED", "CLIENT: Sent message larger than max (150000056 vs. 67108864)"),
     413),
    (errors.ResourceExhausted("RESOURCE_EXHAUSTED", "CLIENT: Received message larger than max (70000000 vs. 67108864)"),
     502),
    (errors.Unavailable("UNAVAILABLE", "no leader"), 503),
    (errors.DeadlineExceeded("DEADLINE_EXCEEDED", "slow"), 504),
    (errors.BrokerError("INTERNAL", "?"), 502),
])
def test_problem_statuses(error: errors.BrokerError, status: int) -> None:
    response = problems.from_error(error)
    assert response.status_code == status and response.media_type == problems.PROBLEM_JSON
    assert problems.status_of(error) == status


@pytest.mark.parametrize(("text", "size", "limit"), [
    ("SERVER: Received message larger than max (10800142 vs. 9437184)", 10800142, 9437184),
    ("CLIENT: Sent message larger than max (150000056 vs. 67108864)", 150000056, 67108864),
])
def test_a_grpc_message_size_error_is_a_413_in_our_words(text: str, size: int, limit: int) -> None:
    """Not 429 (a client retries that forever) and not gRPC's transport text."""
    body = json.loads(bytes(problems.from_error(errors.ResourceExhausted("RESOURCE_EXHAUSTED", text)).body))
    assert body["status"] == 413 and body["reason"] == "REQUEST_TOO_LARGE" and body["limit_bytes"] == limit
    assert body["grpc_code"] == "RESOURCE_EXHAUSTED"
    assert body["detail"] == (f"the request is {size} bytes as one gRPC message, over the cluster's limit of {limit} "
                              "bytes per message: split the batch into smaller ones")


def test_the_body_cap_fits_the_json_of_every_batch_grpc_accepts() -> None:
    """The cap (15 MiB) is the node's largest gRPC message (8 MiB batch + 1 MiB) as base64, plus the
    JSON framing of the most records one HTTP publish carries; both extreme shapes fit."""
    limits = Limits()
    message_bytes_max = limits.batch_bytes_max + (1 << 20)
    assert BODY_BYTES_MAX == body_bytes_max(limits.batch_bytes_max) == 15 << 20
    assert message_bytes_max * 4 // 3 + PUBLISH_RECORDS_MAX * 85 <= BODY_BYTES_MAX
    few = limits.batch_bytes_max // limits.record_bytes_max  # the batch in records of the largest size
    big = [{"value_b64": base64.b64encode(b"v" * limits.record_bytes_max).decode(), "key": "k" * ID_CHARS_MAX,
            "partition": 2**31 - 1, "headers": {"h": "v"}, "idempotency_key": "i" * ID_CHARS_MAX}] * few
    value_bytes = limits.batch_bytes_max // PUBLISH_RECORDS_MAX  # the batch in the most records HTTP takes
    many = [{"value_b64": base64.b64encode(b"v" * value_bytes).decode(), "key": "k" * 16, "partition": 2**31 - 1,
             "headers": {"h": "v"}, "idempotency_key": "i" * 36}] * PUBLISH_RECORDS_MAX
    for records in (big, many):
        assert len(json.dumps({"records": records}, indent=2)) <= BODY_BYTES_MAX


def run_body_limit(chunks: list[bytes], headers: list[tuple[bytes, bytes]], bytes_max: int
                   ) -> tuple[list[Message], int, bytes | None]:
    """Drive :class:`BodyLimit` over ``chunks``: what it sent, how many chunks it pulled, and the body
    the app got (None: the app was not called)."""
    pulled = 0
    got: list[bytes] = []

    async def receive() -> Message:
        nonlocal pulled
        pulled += 1
        if pulled > len(chunks):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        got.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    asyncio.run(BodyLimit(app, bytes_max=bytes_max)(scope, receive, send))
    return sent, pulled, got[0] if got else None


def test_the_body_limit_stops_reading_at_the_cap_and_answers_413() -> None:
    chunks = [b"x" * 4] * 100
    sent, pulled, body = run_body_limit(chunks, [], bytes_max=10)
    assert pulled == 3 and body is None, "read up to the chunk that passes the cap, no further; the app not called"
    assert sent[0]["status"] == 413 and (b"content-type", b"application/problem+json") in sent[0]["headers"]
    answer = json.loads(sent[1]["body"])
    assert answer["limit_bytes"] == 10 and "limit of 10 bytes" in answer["detail"] and "split" in answer["detail"]
    sent, pulled, body = run_body_limit(chunks, [(b"content-length", b"400")], bytes_max=10)
    assert pulled == 0 and body is None and sent[0]["status"] == 413, "a declared length over the cap: none read"
    assert "(400 bytes)" in json.loads(sent[1]["body"])["detail"]


def test_the_body_limit_hands_a_body_within_the_cap_to_the_app_whole() -> None:
    sent, pulled, body = run_body_limit([b"ab", b"cd", b"ef"], [(b"content-length", b"6")], bytes_max=6)
    assert body == b"abcdef" and pulled == 3 and sent[0]["status"] == 200
    sent, _, body = run_body_limit([b""], [], bytes_max=6)
    assert body == b"" and sent[0]["status"] == 200, "no body (a GET): the app runs as before"


def test_the_docs_state_the_body_cap() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "http.md").read_text()
    assert f"{BODY_BYTES_MAX:,} bytes" in docs and "413" in docs
