"""The sync client's ``PublishStreams`` (:mod:`broker.client.publish_streams`) against an in-process
sync gRPC server whose ``PublishStream`` and ``Publish`` follow a script, as the asyncio twin's tests
(``test_publish_streams_unit.py``) do: each stream request is answered, refused with a status, left
without an answer (the stream ends), or never answered; ``Publish`` always answers. Every answer
names the way it travelled and the count so far, so a test reads what was sent how."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from broker.client.publish_streams import PublishStreams
from broker.client.routing import RetryPolicy, Router
from broker.v1 import broker_pb2
from tests.client.publish_script import PublishScript, via

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class ScriptedNode(PublishScript):
    """What the server was sent and how; ``actions`` scripts the stream requests in arrival order:
    "answer", "end" (end the stream without answering), "hang", "internal" (INTERNAL without the
    broker's details trailer, as grpc reports a broken connection), or a status code to abort with."""

    def __init__(self) -> None:
        super().__init__()
        self.executor = futures.ThreadPoolExecutor(max_workers=16)
        self.server = grpc.server(self.executor)
        self.lock = threading.Lock()

    def publish(self, request: bytes, context: grpc.ServicerContext) -> broker_pb2.PublishResponse:
        with self.lock:
            self.unary_requests.append(request)
            return self.answer("unary", len(self.unary_requests))

    def publish_stream(self, requests: Iterator[bytes],
                       context: grpc.ServicerContext) -> Iterator[broker_pb2.PublishResponse]:
        with self.lock:
            self.streams_opened += 1
        try:
            for request in requests:
                with self.lock:
                    self.stream_requests.append(request)
                    action = self.actions.pop(0) if self.actions else "answer"
                    count = len(self.stream_requests)
                if action == "answer":
                    yield self.answer("stream", count)
                elif action == "end":
                    return
                elif action == "hang":
                    while context.is_active():
                        time.sleep(0.01)
                    return
                elif action == "internal":
                    context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
                else:
                    assert isinstance(action, grpc.StatusCode)
                    context.abort(action, f"scripted {action.name}")
        finally:
            with self.lock:
                self.streams_ended += 1


def run(test: Callable[[ScriptedNode, PublishStreams, str], None], idle_s: float = 30.0,
        max_open: int = 32) -> None:
    node = ScriptedNode()
    serialize = broker_pb2.PublishResponse.SerializeToString
    node.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("broker.v1.Broker", {
        "Publish": grpc.unary_unary_rpc_method_handler(node.publish, response_serializer=serialize),
        "PublishStream": grpc.stream_stream_rpc_method_handler(node.publish_stream, response_serializer=serialize),
    })])
    port = node.server.add_insecure_port("127.0.0.1:0")
    node.server.start()
    router = Router([f"127.0.0.1:{port}"], RetryPolicy(timeout_s=5.0, retry_deadline_s=5.0))
    streams = PublishStreams(router, idle_s=idle_s, max_open=max_open)
    try:
        test(node, streams, f"127.0.0.1:{port}")
    finally:
        streams.close()
        router.close()
        node.server.stop(None).wait(10)
        node.executor.shutdown(wait=True)


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_requests_to_one_topic_share_one_stream_and_topics_have_their_own() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        answers = [via(streams.publish(a, "t1", f"r{i}".encode(), 5.0)) for i in range(3)]
        assert answers == [("stream", 1), ("stream", 2), ("stream", 3)]
        assert node.stream_requests == [b"r0", b"r1", b"r2"] and node.streams_opened == 1
        assert via(streams.publish(a, "t2", b"other", 5.0)) == ("stream", 4)
        assert node.streams_opened == 2, "another topic is another stream"
        assert not node.unary_requests

    run(test)


def test_threads_take_turns_on_a_stream_and_a_busy_one_is_not_waited_for() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        streams.publish(a, "t", b"first", 5.0)
        node.actions = ["hang"]
        errors: list[grpc.RpcError] = []

        def slow() -> None:
            try:
                streams.publish(a, "t", b"slow", 0.5)
            except grpc.RpcError as err:
                errors.append(err)

        thread = threading.Thread(target=slow)
        thread.start()
        wait_for(lambda: len(node.stream_requests) == 2, "the slow request to arrive")
        assert via(streams.publish(a, "t", b"beside", 5.0)) == ("unary", 1)
        thread.join(10)
        assert [e.code() for e in errors] == [grpc.StatusCode.DEADLINE_EXCEEDED]

    run(test)


def test_a_refused_request_ends_its_stream_and_the_error_is_the_callers() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        streams.publish(a, "t", b"first", 5.0)
        node.actions = [grpc.StatusCode.FAILED_PRECONDITION]
        with pytest.raises(grpc.RpcError) as err:
            streams.publish(a, "t", b"refused", 5.0)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert not node.unary_requests, "an error after the stream answered is not resent"
        assert via(streams.publish(a, "t", b"next", 5.0)) == ("stream", 3)
        assert node.streams_opened == 2

    run(test)


def test_a_stream_refused_at_its_first_request_sends_it_as_a_unary_call_and_is_not_retried_at_once() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        node.actions = [grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert via(streams.publish(a, "t", b"one", 5.0)) == ("unary", 1)
        assert via(streams.publish(a, "t", b"two", 5.0)) == ("unary", 2)
        assert node.streams_opened == 1 and node.unary_requests == [b"one", b"two"]

    run(test)


def test_a_first_request_refused_otherwise_is_the_callers_error_and_streams_stay_in_use() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        node.actions = [grpc.StatusCode.FAILED_PRECONDITION]  # e.g. not the leader: the router follows
        with pytest.raises(grpc.RpcError) as err:
            streams.publish(a, "t", b"one", 5.0)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert via(streams.publish(a, "t", b"two", 5.0)) == ("stream", 2)
        assert node.streams_opened == 2 and not node.unary_requests

    run(test)


@pytest.mark.parametrize(("action", "said"), [
    ("end", "without an answer"),  # a clean end
    ("internal", "INTERNAL"),  # INTERNAL without the broker's details trailer: a broken connection
])
def test_a_stream_that_ends_without_an_answer_is_an_unknown_outcome(action: str, said: str) -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        streams.publish(a, "t", b"first", 5.0)
        node.actions = [action]
        with pytest.raises(grpc.RpcError) as err:
            streams.publish(a, "t", b"lost", 5.0)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert said in (err.value.details() or "")

    run(test)


def test_no_answer_within_the_timeout_is_deadline_exceeded_and_the_stream_is_dropped() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        streams.publish(a, "t", b"first", 5.0)
        node.actions = ["hang"]
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            streams.publish(a, "t", b"slow", 0.3)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 3.0
        wait_for(lambda: node.streams_ended == 1, "the server to see the stream cancelled")
        assert via(streams.publish(a, "t", b"after", 5.0)) == ("stream", 3)

    run(test)


def test_an_idle_stream_is_closed_and_the_keeper_thread_ends() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        streams.publish(a, "t", b"one", 5.0)
        streams.publish(a, "t", b"two", 5.0)
        wait_for(lambda: node.streams_ended == 1, "the idle stream to close")
        wait_for(lambda: streams._keeper is None, "the keeper thread to end with no stream open")
        assert via(streams.publish(a, "t", b"three", 5.0)) == ("stream", 3)
        assert node.streams_opened == 2

    run(test, idle_s=0.2)


def test_a_node_gone_under_an_open_stream_is_unavailable_which_the_router_retries() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        streams.publish(a, "t", b"first", 5.0)
        node.server.stop(None)  # every connection closed under the open stream
        with pytest.raises(grpc.RpcError) as err:
            streams.publish(a, "t", b"second", 5.0)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value

    run(test)


def test_a_client_holds_at_most_max_open_streams_and_sends_the_rest_as_unary_calls() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        answers = [via(streams.publish(a, f"t{i}", b"r", 5.0)) for i in range(6)]
        assert [way for way, _ in answers] == ["stream"] * 3 + ["unary"] * 3
        assert node.streams_opened == 3
        assert via(streams.publish(a, "t0", b"again", 5.0))[0] == "stream", "open ones serve"

    run(test, max_open=3)


def test_close_ends_every_stream_and_the_keeper() -> None:
    def test(node: ScriptedNode, streams: PublishStreams, a: str) -> None:
        for topic in ("t1", "t2"):
            streams.publish(a, topic, b"r", 5.0)
        streams.close()
        wait_for(lambda: node.streams_ended == 2, "the server to see both streams end")
        wait_for(lambda: streams._keeper is None, "the keeper thread to end")

    run(test)
