"""The per-RPC interceptor on real gRPC servers (sync and asyncio), over every kind of handler."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from broker.services.grpc_metrics import GrpcServerMetrics
from tests.conftest import wait_until

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

SERVICE = "test.Echo"


def _sync_handlers() -> dict[str, grpc.RpcMethodHandler]:
    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        if request == b"bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
        if request == b"boom":
            raise RuntimeError("boom")
        return request

    def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        if request == b"bad":  # before any response (the aio server cannot abort a sync stream later)
            context.abort(grpc.StatusCode.NOT_FOUND, "gone")
        yield request
        yield request

    return {"Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream)}


def _aio_handlers() -> dict[str, grpc.RpcMethodHandler]:
    async def coroutine(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if request == b"bad":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no")
        return request

    async def stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        yield request
        if request == b"bad":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full")
        if request == b"hang":
            await asyncio.sleep(60)
        yield request

    async def bidi(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request

    # sync handlers too: the broker's unary handlers are sync functions on the aio server's pool
    return {**_sync_handlers(), "Coroutine": grpc.unary_unary_rpc_method_handler(coroutine),
            "AsyncStream": grpc.unary_stream_rpc_method_handler(stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi)}


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, {"grpc_service": SERVICE, **labels}) or 0.0


def _handled(registry: CollectorRegistry, method: str, code: str, kind: str) -> float:
    return _value(registry, "raftbroker_grpc_server_handled_total", grpc_method=method, grpc_type=kind,
                  grpc_code=code)


def _call_status(call: Callable[[], Any]) -> grpc.StatusCode:
    try:
        result = call()
        if not isinstance(result, bytes):
            list(result)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _check_sync_methods(channel: grpc.Channel, registry: CollectorRegistry) -> None:
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    stream = channel.unary_stream(f"/{SERVICE}/Stream")
    assert _call_status(lambda: unary(b"ok", timeout=10)) == grpc.StatusCode.OK
    assert _call_status(lambda: unary(b"ok", timeout=10)) == grpc.StatusCode.OK
    assert _call_status(lambda: unary(b"bad", timeout=10)) == grpc.StatusCode.INVALID_ARGUMENT
    assert _call_status(lambda: unary(b"boom", timeout=10)) == grpc.StatusCode.UNKNOWN
    assert _call_status(lambda: stream(b"ok", timeout=10)) == grpc.StatusCode.OK
    assert _call_status(lambda: stream(b"bad", timeout=10)) == grpc.StatusCode.NOT_FOUND
    assert _value(registry, "raftbroker_grpc_server_started_total", grpc_method="Unary", grpc_type="unary") == 4
    _expect_handled(registry, "Unary", "OK", "unary", 2)
    _expect_handled(registry, "Unary", "INVALID_ARGUMENT", "unary", 1)
    _expect_handled(registry, "Unary", "UNKNOWN", "unary", 1)
    _expect_handled(registry, "Stream", "OK", "server_stream", 1)
    _expect_handled(registry, "Stream", "NOT_FOUND", "server_stream", 1)
    wait_until(lambda: _value(registry, "raftbroker_grpc_server_handling_seconds_count", grpc_method="Unary",
                              grpc_type="unary") == 4, 20, "4 Unary latencies observed")
    # messages are counted for streams only: the one that answered sent two, the refused one none
    sent = _value(registry, "raftbroker_grpc_server_msg_sent_total", grpc_method="Stream", grpc_type="server_stream")
    assert sent == 2
    for family in ("raftbroker_grpc_server_msg_sent_total", "raftbroker_grpc_server_msg_received_total"):
        assert registry.get_sample_value(family, {"grpc_service": SERVICE, "grpc_method": "Unary",
                                                  "grpc_type": "unary"}) is None, f"{family} has unary series"


def _check_unknown_method_adds_no_series(channel: grpc.Channel, registry: CollectorRegistry) -> None:
    unknown = channel.unary_unary(f"/{SERVICE}/NoSuchMethod")
    assert _call_status(lambda: unknown(b"x", timeout=10)) == grpc.StatusCode.UNIMPLEMENTED
    names = {s.labels.get("grpc_method") for m in registry.collect() for s in m.samples}
    assert "NoSuchMethod" not in names


def test_sync_server_counts_calls_codes_and_latency() -> None:
    registry = CollectorRegistry()
    metrics = GrpcServerMetrics(registry)
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[metrics.sync_interceptor()])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, _sync_handlers())])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _check_sync_methods(channel, registry)
            _check_unknown_method_adds_no_series(channel, registry)
    finally:
        server.stop(0)


def test_aio_server_counts_sync_and_async_handlers_and_cancelled_streams() -> None:
    registry = CollectorRegistry()
    metrics = GrpcServerMetrics(registry)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def build() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(migration_thread_pool=futures.ThreadPoolExecutor(4),
                                 interceptors=[metrics.aio_interceptor()])
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, _aio_handlers())])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(build(), loop).result(10)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _check_sync_methods(channel, registry)
            _check_unknown_method_adds_no_series(channel, registry)
            coroutine = channel.unary_unary(f"/{SERVICE}/Coroutine")
            assert _call_status(lambda: coroutine(b"ok", timeout=10)) == grpc.StatusCode.OK
            assert _call_status(lambda: coroutine(b"bad", timeout=10)) == grpc.StatusCode.FAILED_PRECONDITION
            _expect_handled(registry, "Coroutine", "OK", "unary", 1)
            _expect_handled(registry, "Coroutine", "FAILED_PRECONDITION", "unary", 1)
            stream = channel.unary_stream(f"/{SERVICE}/AsyncStream")
            assert _call_status(lambda: stream(b"ok", timeout=10)) == grpc.StatusCode.OK
            assert _call_status(lambda: stream(b"bad", timeout=10)) == grpc.StatusCode.RESOURCE_EXHAUSTED
            hanging = stream(b"hang", timeout=30)
            assert next(hanging) == b"hang"
            hanging.cancel()
            bidi = channel.stream_stream(f"/{SERVICE}/Bidi")
            assert list(bidi(iter([b"a", b"b"]), timeout=10)) == [b"a", b"b"]
            assert list(bidi(iter([b"c", b"d", b"e"]), timeout=10)) == [b"c", b"d", b"e"]
            for family in ("raftbroker_grpc_server_msg_received_total", "raftbroker_grpc_server_msg_sent_total"):
                assert _value(registry, family, grpc_method="Bidi", grpc_type="bidi_stream") == 5, family
            _expect_handled(registry, "AsyncStream", "OK", "server_stream", 1)
            _expect_handled(registry, "AsyncStream", "RESOURCE_EXHAUSTED", "server_stream", 1)
            _expect_handled(registry, "Bidi", "OK", "bidi_stream", 2)
            _expect_handled(registry, "AsyncStream", "CANCELLED", "server_stream", 1)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _expect_handled(registry: CollectorRegistry, method: str, code: str, kind: str, count: int) -> None:
    """The asyncio server sends an abort's status before the handler's exception reaches the
    interceptor: poll (briefly) instead of reading once."""
    wait_until(lambda: _handled(registry, method, code, kind) == count, 20,
               f"{method} {code} counted {count} times (now {_handled(registry, method, code, kind)})")
