"""Per-RPC metrics of a gRPC server, by an interceptor for the sync (``grpc.server``) and the asyncio
(``grpc.aio.server``) servers alike.

Families (labels ``grpc_service``, ``grpc_method``, ``grpc_type``; the names follow
go-grpc-prometheus with our prefix):

- ``raftbroker_grpc_server_started_total``: calls started;
- ``raftbroker_grpc_server_handled_total`` (+ ``grpc_code``): calls finished, by status code;
- ``raftbroker_grpc_server_handling_seconds``: histogram of the time from start to status (for a
  stream, its whole life);
- ``raftbroker_grpc_server_msg_received_total`` and ``raftbroker_grpc_server_msg_sent_total``:
  messages read from and written to the client, for streaming methods only (a unary call is one of
  each: its ``handled`` count). Both SDKs publish on long-lived ``PublishStream`` calls, whose
  requests only these show.

Only methods the server has a handler for are counted (an unknown method name sent by a client
creates no series), so the label sets are bounded by the services and the 17 status codes.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram

# seconds: unary calls (a commit is milliseconds) up to long-lived streams (everything above 60 s is +Inf)
HANDLING_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LABELS = ["grpc_service", "grpc_method", "grpc_type"]


def _rpc_type(handler: grpc.RpcMethodHandler) -> str:
    if handler.request_streaming:
        return "bidi_stream" if handler.response_streaming else "client_stream"
    return "server_stream" if handler.response_streaming else "unary"


def _behavior_field(handler: grpc.RpcMethodHandler) -> str:
    return {"unary": "unary_unary", "server_stream": "unary_stream", "client_stream": "stream_unary",
            "bidi_stream": "stream_stream"}[_rpc_type(handler)]


def _split(method: str) -> tuple[str, str]:
    service, _, name = method.lstrip("/").partition("/")
    return service, name


class GrpcServerMetrics:
    """The three families in ``registry``, and interceptors that fill them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.started = Counter("raftbroker_grpc_server_started", "RPCs started on the server", _LABELS,
                               registry=registry)
        self.handled = Counter("raftbroker_grpc_server_handled", "RPCs finished on the server, by status code",
                               [*_LABELS, "grpc_code"], registry=registry)
        self.handling = Histogram("raftbroker_grpc_server_handling_seconds", "Time from the start of an RPC "
                                  "to its status (a stream's whole life)", _LABELS, registry=registry,
                                  buckets=HANDLING_BUCKETS_S)
        self.msg_received = Counter("raftbroker_grpc_server_msg_received", "Messages received on streaming RPCs",
                                    _LABELS, registry=registry)
        self.msg_sent = Counter("raftbroker_grpc_server_msg_sent", "Messages sent on streaming RPCs", _LABELS,
                                registry=registry)
        # method -> (handler, wrapped handler): the interceptor runs for every call; bounded by the methods
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def sync_interceptor(self) -> grpc.ServerInterceptor:
        """For ``grpc.server(..., interceptors=[...])``."""
        return _SyncInterceptor(self)

    def aio_interceptor(self) -> grpc.aio.ServerInterceptor:
        """For ``grpc.aio.server(..., interceptors=[...])``."""
        return _AioInterceptor(self)

    def wrap(self, handler: grpc.RpcMethodHandler | None, method: str) -> grpc.RpcMethodHandler | None:
        """``handler`` with its behaviour timed and counted (None stays None: unknown method)."""
        if handler is None:
            return None
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:  # servers hand out the same handler per method
            return cached[1]
        wrapped = self._wrap(handler, method)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        rpc_type = _rpc_type(handler)
        field = _behavior_field(handler)
        behavior = getattr(handler, field)
        if behavior is None:
            return handler
        call = _Call(self, *_split(method), rpc_type)
        wrapped: grpc.RpcMethodHandler = handler._replace(**{field: call.wrap(behavior)})
        return wrapped


class _Call:
    """Counts and times the calls of one method."""

    def __init__(self, metrics: GrpcServerMetrics, service: str, method: str, rpc_type: str) -> None:
        self._labels = (service, method, rpc_type)
        self._started = metrics.started.labels(*self._labels)
        self._handling = metrics.handling.labels(*self._labels)
        self._handled = metrics.handled
        self._by_code: dict[str, Any] = {}  # status code name -> its child of ``handled``
        self._requests_stream = rpc_type in ("client_stream", "bidi_stream")
        self._received = metrics.msg_received.labels(*self._labels) if self._requests_stream else None
        self._sent = metrics.msg_sent.labels(*self._labels) if rpc_type in ("server_stream", "bidi_stream") else None

    def _incoming(self, request: Any) -> Any:
        """The handler's request, or for a client-streaming call its requests, each counted as read."""
        if not self._requests_stream:
            return request
        received = self._received
        assert received is not None
        if hasattr(request, "__aiter__"):
            async def counted_async() -> AsyncIterator[Any]:
                async for item in request:
                    received.inc()
                    yield item
            return counted_async()

        def counted() -> Iterator[Any]:
            for item in request:
                received.inc()
                yield item
        return counted()

    def _begin(self) -> float:
        self._started.inc()
        return time.perf_counter()

    def _end(self, started: float, context: Any, error: BaseException | None) -> None:
        code = _status_code(context, error)
        child = self._by_code.get(code)
        if child is None:
            child = self._by_code.setdefault(code, self._handled.labels(*self._labels, code))
        child.inc()
        self._handling.observe(time.perf_counter() - started)

    def wrap(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):
            return self._async_gen(behavior)
        if inspect.iscoroutinefunction(behavior):
            return self._coroutine(behavior)
        if inspect.isgeneratorfunction(behavior):
            return self._generator(behavior)
        return self._function(behavior)

    def _function(self, behavior: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def call(request: Any, context: Any) -> Any:
            started = self._begin()
            context = _with_code(context)
            try:
                result = behavior(self._incoming(request), context)
            except BaseException as exc:
                self._end(started, context, exc)
                raise
            # The kind first: a unary call (every publish) skips the ABC isinstance check.
            if self._labels[2] in ("server_stream", "bidi_stream") and isinstance(result, Iterator) \
                    and not isinstance(result, (bytes, str)):
                return self._drain(result, started, context)
            self._end(started, context, None)
            return result
        return call

    def _drain(self, items: Iterator[Any], started: float, context: Any) -> Iterator[Any]:
        try:
            yield from (items if self._sent is None else self._counted(items, self._sent))
        except BaseException as exc:
            self._end(started, context, exc)
            raise
        self._end(started, context, None)

    @staticmethod
    def _counted(items: Iterator[Any], sent: Any) -> Iterator[Any]:
        """``items``, each counted as sent; closed with this generator (a client gone: its finally runs now)."""
        try:
            for item in items:
                sent.inc()
                yield item
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def _generator(self, behavior: Callable[[Any, Any], Iterator[Any]]) -> Callable[[Any, Any], Iterator[Any]]:
        def call(request: Any, context: Any) -> Iterator[Any]:
            started, context = self._begin(), _with_code(context)
            yield from self._drain(behavior(self._incoming(request), context), started, context)
        return call

    def _coroutine(self, behavior: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        async def call(request: Any, context: Any) -> Any:
            started = self._begin()
            try:
                result = await behavior(self._incoming(request), context)
            except BaseException as exc:
                self._end(started, context, exc)
                raise
            self._end(started, context, None)
            return result
        return call

    def _async_gen(self, behavior: Callable[[Any, Any], AsyncIterator[Any]]
                   ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def call(request: Any, context: Any) -> AsyncIterator[Any]:
            started = self._begin()
            sent = self._sent
            try:
                async for item in behavior(self._incoming(request), context):
                    if sent is not None:
                        sent.inc()
                    yield item
            except BaseException as exc:
                self._end(started, context, exc)
                raise
            self._end(started, context, None)
        return call


class _CodeRecorder:
    """A sync servicer context that remembers the code it was given (the asyncio server's context
    for sync handlers has no ``code()``); everything else goes to the real context."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._code: grpc.StatusCode | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code
        self._context.set_code(code)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._code = code
        self._context.abort(code, details)

    def abort_with_status(self, status: grpc.Status) -> None:
        self._code = status.code
        self._context.abort_with_status(status)


def _with_code(context: Any) -> Any:
    return context if callable(getattr(context, "code", None)) else _CodeRecorder(context)


def _status_code(context: Any, error: BaseException | None) -> str:
    """The status the call ends with: the one the handler set (abort, set_code), else OK without an
    error, CANCELLED for a cancelled task or a client gone, UNKNOWN for any other exception."""
    code = None
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - a context without code(): fall back to the outcome
        code = None
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(code, int):  # the asyncio context may return the raw integer
        for status in grpc.StatusCode:
            if status.value[0] == code:
                return status.name
    if error is None or isinstance(error, GeneratorExit):
        return grpc.StatusCode.OK.name if error is None else grpc.StatusCode.CANCELLED.name
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED.name
    return grpc.StatusCode.UNKNOWN.name


class _SyncInterceptor(grpc.ServerInterceptor):
    def __init__(self, metrics: GrpcServerMetrics) -> None:
        self._metrics = metrics

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
                          handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._metrics.wrap(continuation(handler_call_details), handler_call_details.method)


class _AioInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: GrpcServerMetrics) -> None:
        self._metrics = metrics

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return self._metrics.wrap(handler, handler_call_details.method)
