"""The sync client's coalesced publishes over long-lived ``PublishStream`` calls: the twin of
:mod:`broker.client.aio.publish_streams`, with the same contract (read it there) and the constants
both share.

Why here too: measured with a lone thread publishing 1-record requests through ``Client.publish``
to 3 nodes (disk, ``bench/NOTE.md`` 2026-12-02 06:05-06:12 UTC): p50 1.35-1.51 ms as unary calls
against 1.19-1.28 ms on the topic's stream, the leader's CPU per request 1,010-1,143 us against
797-857 us.

How the sync side differs from the asyncio one:

- grpc's sync streams read their requests from an iterator in a thread of their own; each stream's
  iterator is a queue (:class:`_Requests`): a request is put, and the caller blocks on the stream's
  next answer. A request put on a stream that had already ended is never sent; the caller then gets
  the stream's end as its error (below), as the asyncio write's failure.
- A sync call has no deadline per message, so one keeper thread per :class:`PublishStreams`
  (running while any stream is open) cancels a stream whose answer is late, which the caller reports
  as DEADLINE_EXCEEDED, and closes streams unused for ``idle_s``. It wakes at the next deadline or
  every :data:`KEEPER_TICK_S`, so a request's deadline costs no wake-up unless it is shorter.
- Status of a stream's end: the node's own answer (its details trailer) is kept as it is; grpc's
  INTERNAL without one (a connection broken under the stream) and a CANCELLED the client did not
  cause are UNAVAILABLE, which the router retries as an unknown outcome.
- The sync client sends no per-call metadata, so a stream is one per (node, topic).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from broker.client.errors import error_info
from broker.client.packing import PUBLISH_STREAM_METHOD
from broker.client.routing import Router
from broker.v1 import broker_pb2

IDLE_S = 30.0
# streams one client keeps open at most: a caller whose call metadata differs per call (a trace id,
# say) would otherwise open a stream per publish and hold them all for IDLE_S, filling the node's
# max_streams (which its subscribers share); past this, new (node, topic, metadata) go unary
MAX_OPEN = 32
# a stream's first request failing so: the node refuses streams (max_streams reached, or no such method)
REFUSED = frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED})
KEEPER_TICK_S = 1.0  # the keeper thread's longest sleep while a stream is open

_Key = tuple[str, str]
K = TypeVar("K", bound=Hashable)


class Refusals(Generic[K]):
    """Where a node refused a stream (both SDKs'): requests for those keys go as unary calls for
    ``hold_s``, then a stream is tried again. Times are the caller's clock, in seconds."""

    __slots__ = ("_hold_s", "_until")

    def __init__(self, hold_s: float) -> None:
        self._hold_s = hold_s
        self._until: dict[K, float] = {}

    def __bool__(self) -> bool:
        return bool(self._until)

    def note(self, key: K, now: float) -> None:
        self._until[key] = now + self._hold_s

    def holds(self, key: K, now: float) -> bool:
        """True while ``key``'s refusal holds (an expired one is forgotten)."""
        until = self._until.get(key)
        if until is None:
            return False
        if now < until:
            return True
        del self._until[key]
        return False


def stream_error(code: grpc.StatusCode, details: str) -> grpc.RpcError:
    """A failed call's error made on the client side (both SDKs' routers read it as a call's)."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def _ended(err: grpc.RpcError) -> grpc.RpcError:
    """What the caller reports for a stream that ended with ``err`` instead of its answer."""
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    if error_info(err) is not None or code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED):
        return err  # the node's answer (or UNAVAILABLE, DEADLINE_EXCEEDED...: the router knows them)
    details = err.details() if isinstance(err, grpc.Call) else str(err)
    return stream_error(grpc.StatusCode.UNAVAILABLE, f"the publish stream broke ({code.name}: {details})")


class _Requests:
    """A stream's request iterator (grpc reads it in a thread of its own); ``end`` ends the stream's sending."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def __iter__(self) -> _Requests:
        return self

    def __next__(self) -> bytes:
        data = self._queue.get()
        if data is None:
            raise StopIteration
        return data

    def put(self, data: bytes) -> None:
        self._queue.put(data)

    def end(self) -> None:
        self._queue.put(None)


class _Stream:
    __slots__ = ("answered", "busy", "call", "deadline", "requests", "timed_out", "used_at")

    def __init__(self, call: Any, requests: _Requests) -> None:
        self.call = call
        self.requests = requests
        self.busy = False
        self.answered = False  # at least one answer came back on it
        self.used_at = 0.0
        self.deadline = 0.0  # of the request in flight (while busy)
        self.timed_out = False  # the keeper cancelled it: its request's answer was late


class PublishStreams:
    """Open ``PublishStream`` calls of one sync client (see the module); thread-safe."""

    def __init__(self, router: Router, idle_s: float = IDLE_S, max_open: int = MAX_OPEN) -> None:
        self._router = router
        self._idle_s = idle_s
        self._max_open = max_open
        self._lock = threading.Condition()
        self._streams: dict[_Key, _Stream] = {}
        self._refusals: Refusals[_Key] = Refusals(idle_s)
        self._keeper: threading.Thread | None = None
        self._wake_at = float("inf")  # when the keeper wakes next (notified only for an earlier deadline)

    def publish(self, address: str, topic: str, data: bytes, timeout_s: float) -> broker_pb2.PublishResponse:
        """Publish the serialized ``PublishRequest`` ``data`` to ``address`` (a unary ``Publish``'s meaning)."""
        key = (address, topic)
        with self._lock:
            stream = self._take(key, timeout_s)
        if stream is None:
            return self._unary(address, data, timeout_s)
        try:
            response = self._exchange(stream, data, timeout_s)
        except grpc.RpcError as err:
            with self._lock:
                self._drop(key, stream)
                if stream.answered or err.code() not in REFUSED:
                    raise
                self._refusals.note(key, time.monotonic())
            return self._unary(address, data, timeout_s)
        except BaseException:
            with self._lock:
                self._drop(key, stream)
            raise
        with self._lock:
            stream.busy = False
            stream.answered = True
            stream.used_at = time.monotonic()
        return response

    def close(self) -> None:
        """End every stream and the keeper (a request still in flight on one, from another thread,
        ends with UNAVAILABLE, and its retry finds the client's channels closed)."""
        with self._lock:
            for key, stream in list(self._streams.items()):
                self._drop(key, stream)
            self._lock.notify_all()

    def _take(self, key: _Key, timeout_s: float) -> _Stream | None:
        """The stream to send on, marked busy until ``timeout_s`` from now; None: send a unary call."""
        stream = self._streams.get(key)
        now = time.monotonic()
        if (stream is not None and stream.busy) or (self._refusals and self._refusals.holds(key, now)):
            return None
        if stream is None or stream.call.done():
            if stream is None and len(self._streams) >= self._max_open:
                return None
            if stream is not None:
                self._drop(key, stream)
            stream = self._open(key)
        stream.busy = True
        stream.timed_out = False
        stream.deadline = now + timeout_s
        if stream.deadline < self._wake_at:
            self._lock.notify_all()
        return stream

    def _open(self, key: _Key) -> _Stream:
        requests = _Requests()
        call = self._router.channel(key[0]).stream_stream(
            PUBLISH_STREAM_METHOD, request_serializer=None,
            response_deserializer=broker_pb2.PublishResponse.FromString)(requests)
        stream = self._streams[key] = _Stream(call, requests)
        if self._keeper is None:
            self._keeper = threading.Thread(target=self._keep, name="raftbroker-publish-streams", daemon=True)
            self._keeper.start()
        return stream

    def _exchange(self, stream: _Stream, data: bytes, timeout_s: float) -> broker_pb2.PublishResponse:
        stream.requests.put(data)
        try:
            response: broker_pb2.PublishResponse = next(stream.call)
        except StopIteration:
            raise stream_error(grpc.StatusCode.UNAVAILABLE, "the publish stream ended without an answer") from None
        except grpc.RpcError as err:
            if stream.timed_out:
                raise stream_error(grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"no answer on the publish stream within {timeout_s:g}s") from None
            raise _ended(err) from None
        return response

    def _unary(self, address: str, data: bytes, timeout_s: float) -> broker_pb2.PublishResponse:
        response: broker_pb2.PublishResponse = self._router.publisher(address).Publish(data, timeout=timeout_s)
        return response

    def _drop(self, key: _Key, stream: _Stream) -> None:
        """Forget and end ``stream`` (under the lock)."""
        if self._streams.get(key) is stream:
            del self._streams[key]
        stream.call.cancel()
        stream.requests.end()  # grpc's reading thread ends too

    def _keep(self) -> None:
        """The keeper thread: cancels late streams and closes idle ones; ends when no stream is open."""
        with self._lock:
            while self._streams:
                now = time.monotonic()
                wake = now + KEEPER_TICK_S
                for key, stream in list(self._streams.items()):
                    if stream.busy:
                        if stream.deadline <= now and not stream.timed_out:
                            stream.timed_out = True
                            stream.call.cancel()  # its caller's next() raises: DEADLINE_EXCEEDED
                        elif not stream.timed_out:
                            wake = min(wake, stream.deadline)
                    elif now - stream.used_at >= self._idle_s:
                        self._drop(key, stream)
                    else:
                        wake = min(wake, stream.used_at + self._idle_s)
                self._wake_at = wake
                self._lock.wait(max(wake - now, 0.0))
            self._keeper = None
            self._wake_at = float("inf")
