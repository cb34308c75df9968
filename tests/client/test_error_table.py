"""The server's one mapping (``broker.services.errors.status_for``) and the SDK's one table
(``broker.client.errors.error_from_rpc``) agree: every core error comes out as the SDK class
named for its reason, with the same code, message, reason and resource names."""

from __future__ import annotations

import grpc
import pytest

from broker.client import errors as sdk
from broker.client.routing import Outcome, classify
from broker.core import errors as core
from broker.reasons import Reason
from broker.security.interceptor import Denied
from broker.services.errors import status_for

pytestmark = pytest.mark.unit


class Failed(grpc.RpcError, grpc.Call):
    """A finished call's error as a channel hands it over: code, details, trailers."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str | bytes], ...]) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._trailers


def through_the_wire(exc: Exception) -> sdk.BrokerError:
    return sdk.error_from_rpc(Failed(*status_for(exc)))


CASES: list[tuple[Exception, type[sdk.BrokerError], dict[str, str]]] = [
    (core.InvalidArgument("bad"), sdk.InvalidArgument, {}),
    (core.TopicNotFound("t"), sdk.TopicNotFound, {"topic": "t"}),
    (core.TopicExists("t"), sdk.TopicExists, {"topic": "t"}),
    (core.GroupNotFound("t", "g"), sdk.GroupNotFound, {"topic": "t", "group": "g"}),
    (core.GroupExists("t", "g"), sdk.GroupExists, {"topic": "t", "group": "g"}),
    (core.RouteNotFound("r"), sdk.RouteNotFound, {"route": "r"}),
    (core.RouteExists("r"), sdk.RouteExists, {"route": "r"}),
    (core.MemberNotFound("n9"), sdk.MemberNotFound, {"node_id": "n9"}),
    (core.MemberExists("taken"), sdk.MemberExists, {}),
    (core.DuplicateMessage("dup"), sdk.DuplicateMessageError, {}),
    (core.NotFound("thing"), sdk.NotFound, {}),
    (core.AlreadyExists("thing"), sdk.AlreadyExists, {}),
    (core.FailedPrecondition("cycle"), sdk.FailedPrecondition, {}),
    (core.NotLeader("h:1"), sdk.Unavailable, {"leader": "h:1"}),
    (core.NotLeader("h:1", no_quorum=True), sdk.Unavailable, {"leader": "h:1", "no_quorum": "true"}),
    (core.NoQuorum("alone"), sdk.Unavailable, {}),
    (core.Unavailable("later"), sdk.Unavailable, {}),
    (core.SessionOutOfSequence("gap"), sdk.SessionOutOfSequence, {}),
    (core.ResourceExhausted("full"), sdk.ResourceExhausted, {}),
    (core.Unimplemented("not yet"), sdk.Unimplemented, {}),
    (core.DataLoss("damaged"), sdk.BrokerError, {}),
    (core.ApplyFailed("bug"), sdk.BrokerError, {}),
    (RuntimeError("boom"), sdk.BrokerError, {}),
]


@pytest.mark.parametrize(("exc", "cls", "metadata"), CASES, ids=lambda v: type(v).__name__)
def test_every_core_error_becomes_the_sdk_class_of_its_reason(exc: Exception, cls: type[sdk.BrokerError],
                                                               metadata: dict[str, str]) -> None:
    code, message, _ = status_for(exc)
    err = through_the_wire(exc)
    assert type(err) is cls
    assert (err.code, err.message, err.metadata) == (code.name, message, metadata)
    assert err.reason == getattr(exc, "reason", Reason.INTERNAL)


def test_every_reason_is_sent_by_some_core_error_or_the_auth_interceptor() -> None:
    sent = {getattr(exc, "reason", Reason.INTERNAL) for exc, _, _ in CASES}
    by_the_sdk = {Reason.REQUEST_TOO_LARGE, Reason.ANSWER_TOO_LARGE}  # gRPC's own size refusals, told by the SDK
    assert sent | {Reason.STREAM_REAUTHENTICATE} | by_the_sdk == set(Reason)


@pytest.mark.parametrize(("text", "reason", "said", "refused"), [
    ("SERVER: Received message larger than max (10800142 vs. 9437184)", Reason.REQUEST_TOO_LARGE,
     "the request is 10800142 bytes as one gRPC message, over the node's limit of 9437184 bytes per message: "
     "split the batch into smaller ones", True),
    ("CLIENT: Sent message larger than max (150000056 vs. 67108864)", Reason.REQUEST_TOO_LARGE,
     "the request is 150000056 bytes as one gRPC message, over this client's limit of 67108864 bytes per "
     "message: split the batch into smaller ones", True),
    ("CLIENT: Received message larger than max (70000000 vs. 67108864)", Reason.ANSWER_TOO_LARGE,
     "the answer is 70000000 bytes as one gRPC message, over this client's limit of 67108864 bytes per message: "
     "ask for less at a time", False),
])
def test_grpcs_message_size_refusal_is_told_in_our_words(text: str, reason: Reason, said: str, refused: bool) -> None:
    err = sdk.error_from_rpc(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, text, ()))
    assert type(err) is sdk.ResourceExhausted and (err.reason, err.message, err.refused) == (reason, said, refused)
    size, limit = (int(n) for n in text.split("(")[1].rstrip(")").split(" vs. "))
    assert err.metadata == {"size_bytes": str(size), "limit_bytes": str(limit)}
    assert classify(Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, text, ()))[0] is Outcome.FINAL, "never retried"


def test_a_stream_whose_token_no_longer_authenticates_is_opened_again_and_a_refused_token_is_final() -> None:
    denied = Denied(grpc.StatusCode.UNAUTHENTICATED, "this stream's credentials no longer authenticate",
                    Reason.STREAM_REAUTHENTICATE)
    cut_off = Failed(denied.code, str(denied), denied.trailers())
    err = sdk.error_from_rpc(cut_off)
    assert type(err) is sdk.Unauthenticated and err.reason == Reason.STREAM_REAUTHENTICATE
    assert classify(cut_off) == (Outcome.NOT_SENT, None)
    assert classify(Failed(grpc.StatusCode.UNAUTHENTICATED, "unknown bearer token", ()))[0] is Outcome.FINAL


def test_refused_is_decided_by_the_reason() -> None:
    assert through_the_wire(core.DuplicateMessage("dup")).refused
    assert through_the_wire(core.GroupNotFound("t", "g")).refused
    assert not through_the_wire(core.Unavailable("later")).refused
    assert not through_the_wire(core.ResourceExhausted("full")).refused


def test_without_details_the_code_decides() -> None:
    err = sdk.error_from_rpc(Failed(grpc.StatusCode.NOT_FOUND, "gone", ()))
    assert type(err) is sdk.NotFound and err.reason == "" and err.refused
    garbage = sdk.error_from_rpc(Failed(grpc.StatusCode.ALREADY_EXISTS, "x", (("grpc-status-details-bin", b"\xff"),)))
    assert type(garbage) is sdk.AlreadyExists
