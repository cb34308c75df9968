"""Unit tests of the gateway's pure parts and of the SDK's reading of asyncio gRPC errors."""

from __future__ import annotations

import grpc
import grpc.aio
import pytest

from broker.client import errors
from broker.client.routing import Outcome, classify
from broker.http import codec, problems

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
    for value, b64 in ((None, None), (1, "AA=="), (None, "not base64!")):
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
    (errors.Unavailable("UNAVAILABLE", "no leader"), 503),
    (errors.DeadlineExceeded("DEADLINE_EXCEEDED", "slow"), 504),
    (errors.BrokerError("INTERNAL", "?"), 502),
])
def test_problem_statuses(error: errors.BrokerError, status: int) -> None:
    response = problems.from_error(error)
    assert response.status_code == status and response.media_type == problems.PROBLEM_JSON
