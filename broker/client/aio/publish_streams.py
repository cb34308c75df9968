"""Coalesced publishes over long-lived ``PublishStream`` calls instead of one ``Publish`` call each.

Why: a unary call costs the node more than a message on an open stream (a new HTTP/2 stream, the
call's set-up and the interceptors, every time). Measured with a closed loop of 1-record publishes
through the SDK (``bench/NOTE.md``, 2026-12-02): the leader's CPU per request 1,287-1,663 us as calls
against 913-1,060 us on a stream (3 nodes, disk), p50 1.81-2.40 against 1.41-1.55 ms.

The contract: :meth:`PublishStreams.publish` has the meaning of one unary ``Publish`` of the same
bytes to the same node, errors included, so the router's retry loop (redirects, unknown outcomes,
the same bytes resent) applies unchanged, and a retry of a producer-session range stores nothing
twice whichever way each attempt travelled.

- One stream per (node, topic, call metadata), used by one request at a time: the server answers a
  stream's requests one by one, in order, and the coalescer keeps one request in flight per topic. A
  stream found busy is not waited for: the request goes as a unary call.
- A request's error ends its stream (the server aborts it with the request's status, ``x-leader``
  included); the next request opens a new one.
- A stream refused at its first request with RESOURCE_EXHAUSTED or UNIMPLEMENTED (the node refuses
  streams: ``max_streams`` reached, or a server without the method) sends that request again as a
  unary call, the same bytes, whose answer or error is the one reported, and that node gets unary
  calls for ``idle_s`` before a stream is tried again. Nothing is stored twice: it is a retry of the
  same range. (A topic that is full answers RESOURCE_EXHAUSTED too: the unary call then answers the
  same, and the topic's publishes go unary for a while, which costs some CPU and nothing else.)
- A write that fails (the stream had ended: grpc reports a connection that broke under it as
  INTERNAL) is UNAVAILABLE, unless it is the node's refusal of the stream (above).
- A stream that ends without an answer (a clean end) is UNAVAILABLE: the outcome is unknown, the
  router resends.
- ``timeout_s`` bounds the wait for the answer; past it the stream is cancelled and the error is
  DEADLINE_EXCEEDED, as a unary call's deadline would be.
- A stream unused for ``idle_s`` is closed, so idle clients hold no slot of a node's ``max_streams``,
  and a client holds at most ``max_open`` streams: requests for any other (node, topic, metadata)
  go as unary calls meanwhile.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from broker.client.aio.routing import AsyncRouter, Metadata
from broker.client.packing import PUBLISH_STREAM_METHOD
from broker.client.publish_streams import IDLE_S, MAX_OPEN, REFUSED, Refusals, stream_error
from broker.v1 import broker_pb2

_Key = tuple[str, str, Metadata]


async def _ended(call: Any) -> grpc.RpcError:
    """The error of a stream that ended before a request could be written: its own status, if not OK."""
    code = await call.code()
    if code == grpc.StatusCode.OK:
        return stream_error(grpc.StatusCode.UNAVAILABLE, "the publish stream ended before the request")
    return grpc.aio.AioRpcError(code, await call.initial_metadata(), await call.trailing_metadata(),
                                await call.details())


def _unsent(err: grpc.RpcError) -> grpc.RpcError:
    """The error of a write that failed: the stream had ended, so the request was not sent. A node's
    refusal of the stream is kept as it is; anything else (grpc reports a connection that broke under
    a write as INTERNAL "Internal error from Core") is UNAVAILABLE, which the router retries."""
    if err.code() in REFUSED:
        return err
    return stream_error(grpc.StatusCode.UNAVAILABLE, f"the publish stream ended before the request was sent "
                                                     f"({err.code().name}: {err.details()})")


class _Stream:
    __slots__ = ("answered", "busy", "call", "idle_timer", "used_at")

    def __init__(self, call: Any) -> None:
        self.call = call
        self.busy = False
        self.answered = False  # at least one answer came back on it
        self.used_at = 0.0
        self.idle_timer: asyncio.TimerHandle | None = None


class PublishStreams:
    """Open ``PublishStream`` calls of one client (see the module). Use from one event loop."""

    def __init__(self, router: AsyncRouter, idle_s: float = IDLE_S, max_open: int = MAX_OPEN) -> None:
        self._router = router
        self._idle_s = idle_s
        self._max_open = max_open
        self._streams: dict[_Key, _Stream] = {}
        self._refusals: Refusals[_Key] = Refusals(idle_s)

    async def publish(self, address: str, topic: str, data: bytes, timeout_s: float,
                      metadata: Metadata | None) -> broker_pb2.PublishResponse:
        """Publish the serialized ``PublishRequest`` ``data`` to ``address`` (a unary ``Publish``'s meaning)."""
        key = (address, topic, metadata or ())
        stream = self._streams.get(key)
        loop = asyncio.get_running_loop()
        if (stream is not None and stream.busy) or (self._refusals and self._refusals.holds(key, loop.time())):
            return await self._unary(address, data, timeout_s, metadata)
        if stream is None or stream.call.done():
            if stream is None and len(self._streams) >= self._max_open:
                return await self._unary(address, data, timeout_s, metadata)
            stream = self._open(key, metadata)
        stream.busy = True
        try:
            response = await self._exchange(stream, data, timeout_s)
        except grpc.RpcError as err:
            self._drop(key, stream)
            if stream.answered or err.code() not in REFUSED:
                raise
            self._refusals.note(key, loop.time())
            return await self._unary(address, data, timeout_s, metadata)
        except BaseException:
            self._drop(key, stream)
            raise
        stream.busy = False
        stream.answered = True
        stream.used_at = loop.time()
        if stream.idle_timer is None:
            stream.idle_timer = loop.call_later(self._idle_s, self._check_idle, key, stream)
        return response

    async def close(self) -> None:
        """Cancel every stream (none carries a request by then: the coalescer has drained)."""
        streams, self._streams = list(self._streams.items()), {}
        for key, stream in streams:
            self._drop(key, stream)

    def _open(self, key: _Key, metadata: Metadata | None) -> _Stream:
        channel = self._router.channel(key[0])
        call = channel.stream_stream(PUBLISH_STREAM_METHOD, request_serializer=None,
                                     response_deserializer=broker_pb2.PublishResponse.FromString)(metadata=metadata)
        stream = self._streams[key] = _Stream(call)
        return stream

    async def _exchange(self, stream: _Stream, data: bytes, timeout_s: float) -> broker_pb2.PublishResponse:
        call = stream.call
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    await call.write(data)
                except grpc.RpcError as err:
                    raise _unsent(err) from None
                response = await call.read()
        except TimeoutError:
            raise stream_error(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"no answer on the publish stream within {timeout_s:g}s") from None
        except asyncio.InvalidStateError:  # the stream ended between our check and the write
            raise await _ended(call) from None
        if response is grpc.aio.EOF:
            raise stream_error(grpc.StatusCode.UNAVAILABLE, "the publish stream ended without an answer")
        result: broker_pb2.PublishResponse = response
        return result

    async def _unary(self, address: str, data: bytes, timeout_s: float,
                     metadata: Metadata | None) -> broker_pb2.PublishResponse:
        response: broker_pb2.PublishResponse = await self._router.publisher(address).Publish(
            data, timeout=timeout_s, metadata=metadata)
        return response

    def _drop(self, key: _Key, stream: _Stream) -> None:
        if self._streams.get(key) is stream:
            del self._streams[key]
        if stream.idle_timer is not None:
            stream.idle_timer.cancel()
            stream.idle_timer = None
        stream.call.cancel()

    def _check_idle(self, key: _Key, stream: _Stream) -> None:
        stream.idle_timer = None
        if self._streams.get(key) is not stream:
            return
        loop = asyncio.get_running_loop()
        left = stream.used_at + self._idle_s - loop.time()
        if stream.busy or left > 0:
            stream.idle_timer = loop.call_later(max(left, 0.0) if not stream.busy else self._idle_s,
                                                self._check_idle, key, stream)
            return
        self._drop(key, stream)
