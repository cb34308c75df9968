"""``PublishStreams`` (:mod:`broker.client.aio.publish_streams`) against an in-process grpc.aio server
whose ``PublishStream`` and ``Publish`` follow a script: each stream request is answered, refused with
a status, left without an answer (the stream ends), or never answered; ``Publish`` always answers.
Every answer names the way it travelled and the count so far, so a test reads what was sent how."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import grpc.aio
import pytest

from broker.client.aio.publish_streams import PublishStreams
from broker.client.aio.routing import AsyncRouter
from broker.client.routing import RetryPolicy
from broker.v1 import broker_pb2
from tests.client.publish_script import PublishScript, via

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class ScriptedNode(PublishScript):
    """What the server was sent and how; ``actions`` scripts the stream requests in arrival order:
    "answer", "end" (end the stream without answering), "hang", or a status code to abort with."""

    def __init__(self) -> None:
        super().__init__()
        self.server = grpc.aio.server()

    async def publish(self, request: bytes, context: grpc.aio.ServicerContext) -> broker_pb2.PublishResponse:
        self.unary_requests.append(request)
        return self.answer("unary", len(self.unary_requests))

    async def publish_stream(self, requests: AsyncIterator[bytes],
                             context: grpc.aio.ServicerContext) -> AsyncIterator[broker_pb2.PublishResponse]:
        self.streams_opened += 1
        try:
            async for request in requests:
                self.stream_requests.append(request)
                action = self.actions.pop(0) if self.actions else "answer"
                if action == "answer":
                    yield self.answer("stream", len(self.stream_requests))
                elif action == "end":
                    return
                elif action == "hang":
                    await asyncio.sleep(3600)
                else:
                    assert isinstance(action, grpc.StatusCode)
                    await context.abort(action, f"scripted {action.name}")
        finally:
            self.streams_ended += 1


async def serving(test: Callable[[ScriptedNode, PublishStreams], Awaitable[None]], idle_s: float = 30.0,
                  max_open: int = 32) -> None:
    node = ScriptedNode()
    server = node.server
    serialize = broker_pb2.PublishResponse.SerializeToString
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("broker.v1.Broker", {
        "Publish": grpc.unary_unary_rpc_method_handler(node.publish, response_serializer=serialize),
        "PublishStream": grpc.stream_stream_rpc_method_handler(node.publish_stream, response_serializer=serialize),
    })])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    router = AsyncRouter([f"127.0.0.1:{port}"], RetryPolicy(timeout_s=5.0, retry_deadline_s=5.0))
    streams = PublishStreams(router, idle_s=idle_s, max_open=max_open)
    try:
        await test(node, streams)
    finally:
        await streams.close()
        await router.close()
        await server.stop(None)


def run(test: Callable[[ScriptedNode, PublishStreams], Awaitable[None]], idle_s: float = 30.0,
        max_open: int = 32) -> None:
    asyncio.run(serving(test, idle_s, max_open))


async def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def address(streams: PublishStreams) -> str:
    return streams._router.known_addresses[0]


def test_requests_to_one_topic_share_one_stream_and_topics_have_their_own() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        answers = [via(await streams.publish(a, "t1", f"r{i}".encode(), 5.0, None)) for i in range(3)]
        assert answers == [("stream", 1), ("stream", 2), ("stream", 3)]
        assert node.stream_requests == [b"r0", b"r1", b"r2"] and node.streams_opened == 1
        await streams.publish(a, "t2", b"other", 5.0, None)
        await streams.publish(a, "t1", b"auth", 5.0, (("authorization", "Bearer x"),))
        assert node.streams_opened == 3, "another topic, or other call metadata, is another stream"
        assert not node.unary_requests

    run(test)


def test_a_refused_request_ends_its_stream_and_the_error_is_the_callers() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        await streams.publish(a, "t", b"first", 5.0, None)
        node.actions = [grpc.StatusCode.FAILED_PRECONDITION]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await streams.publish(a, "t", b"refused", 5.0, None)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert not node.unary_requests, "an error after the stream answered is not resent"
        assert via(await streams.publish(a, "t", b"next", 5.0, None)) == ("stream", 3)
        assert node.streams_opened == 2

    run(test)


def test_a_stream_refused_at_its_first_request_sends_it_as_a_unary_call_and_is_not_retried_at_once() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        node.actions = [grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert via(await streams.publish(a, "t", b"one", 5.0, None)) == ("unary", 1)
        assert via(await streams.publish(a, "t", b"two", 5.0, None)) == ("unary", 2)
        assert node.streams_opened == 1 and node.unary_requests == [b"one", b"two"]

    run(test)


def test_a_first_request_refused_otherwise_is_the_callers_error_and_streams_stay_in_use() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        node.actions = [grpc.StatusCode.FAILED_PRECONDITION]  # e.g. not the leader: the router follows
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await streams.publish(a, "t", b"one", 5.0, None)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert via(await streams.publish(a, "t", b"two", 5.0, None)) == ("stream", 2)
        assert node.streams_opened == 2 and not node.unary_requests

    run(test)


def test_a_stream_that_ends_without_an_answer_is_an_unknown_outcome() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        await streams.publish(a, "t", b"first", 5.0, None)
        node.actions = ["end"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await streams.publish(a, "t", b"lost", 5.0, None)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "without an answer" in (err.value.details() or "")

    run(test)


def test_no_answer_within_the_timeout_is_deadline_exceeded_and_the_stream_is_dropped() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        await streams.publish(a, "t", b"first", 5.0, None)
        node.actions = ["hang"]
        started = asyncio.get_running_loop().time()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await streams.publish(a, "t", b"slow", 0.3, None)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert asyncio.get_running_loop().time() - started < 3.0
        await wait_for(lambda: node.streams_ended == 1, "the server to see the stream cancelled")
        assert via(await streams.publish(a, "t", b"after", 5.0, None)) == ("stream", 3)

    run(test)


def test_a_busy_stream_is_not_waited_for() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        await streams.publish(a, "t", b"first", 5.0, None)
        node.actions = ["hang"]
        slow = asyncio.create_task(streams.publish(a, "t", b"slow", 0.5, None))
        await wait_for(lambda: len(node.stream_requests) == 2, "the slow request to arrive")
        assert via(await streams.publish(a, "t", b"beside", 5.0, None)) == ("unary", 1)
        with pytest.raises(grpc.aio.AioRpcError):
            await slow

    run(test)


def test_an_idle_stream_is_closed() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        await streams.publish(a, "t", b"one", 5.0, None)
        await streams.publish(a, "t", b"two", 5.0, None)
        await wait_for(lambda: node.streams_ended == 1, "the idle stream to close")
        assert via(await streams.publish(a, "t", b"three", 5.0, None)) == ("stream", 3)
        assert node.streams_opened == 2

    run(test, idle_s=0.2)


def test_a_node_gone_under_an_open_stream_is_unavailable_which_the_router_retries() -> None:
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        await streams.publish(a, "t", b"first", 5.0, None)
        await node.server.stop(None)  # every connection closed under the open stream
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await streams.publish(a, "t", b"second", 5.0, None)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value

    run(test)


def test_a_client_holds_at_most_max_open_streams_and_sends_the_rest_as_unary_calls() -> None:
    """Call metadata that differs per call (a trace id, say) must not open a stream per publish."""
    async def test(node: ScriptedNode, streams: PublishStreams) -> None:
        a = address(streams)
        answers = [via(await streams.publish(a, "t", b"r", 5.0, (("trace", str(i)),))) for i in range(6)]
        assert [way for way, _ in answers] == ["stream"] * 3 + ["unary"] * 3
        assert node.streams_opened == 3
        assert via(await streams.publish(a, "t", b"again", 5.0, (("trace", "0"),)))[0] == "stream", "open ones serve"

    run(test, max_open=3)
