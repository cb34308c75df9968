"""The gateway's HTTP connections, bounded: uvicorn's h11 protocol with a head deadline, a body
idle timeout and a cap on connections.

uvicorn bounds none of these by itself (only the idle time between two requests on a kept-alive
connection). An audit held 1,000 half-sent request heads open for as long as it liked, one file
descriptor each, and 19,980 of them took a node to its limit of open files: its gRPC port then
refused clients and health checks too (the gateway runs in the node's process). So, per
connection (:class:`HttpLimits`):

- a request head not complete ``head_timeout_s`` after the connection was accepted, or after the
  previous response ended, closes the connection: a client sends its head at once, so only an idle
  or trickling one is dropped (the deadline is not moved by the bytes that trickle in);
- a request body that sends nothing for ``body_idle_s`` closes the connection (a POST whose
  Content-Length promises more than it sends); a slow upload that keeps sending goes on;
- at most ``connections_max`` connections: one more closes the oldest connection still waiting
  for its first request head, else the oldest waiting for a next one (a client keeping its
  connection alive between requests: it was the oldest, so a flood of new idle connections closed
  those first), or, when every connection has a request in hand (an SSE stream, a publish), the new
  one at once. A flood of idle connections cannot lock out the clients that send requests.

A response in progress (an SSE stream for hours) is never timed out here: it holds a request the
caller made, and the node's own stream limit (``max_streams``) bounds those.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from broker.http.problems import PROBLEM_JSON

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    head_timeout_s: float = 10.0
    body_idle_s: float = 30.0
    connections_max: int = 1024
    # live watches (SSE) at once, below the connection cap, which closes only connections waiting for
    # a request head: 1,024 watches held open by one caller shut every other client out of the gateway
    watches_max: int = 768

    def __post_init__(self) -> None:
        assert 0 < self.head_timeout_s <= 600 and 0 < self.body_idle_s <= 3600, self
        assert 1 <= self.connections_max <= 1_000_000, self
        assert 1 <= self.watches_max < self.connections_max, self


HTTP_LIMITS = HttpLimits()


class GuardedH11Protocol(H11Protocol):
    """See the module docstring; :func:`protocol_class` makes one with its limits."""

    limits: ClassVar[HttpLimits] = HTTP_LIMITS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._guard: asyncio.TimerHandle | None = None
        self._waiting_head = False
        self._served = False  # a response was sent on it: a client, not one of a flood of idle connections
        super().connection_made(transport)
        order = _order(self.server_state)
        order[self] = None
        self._wait_for_head()
        if len(order) > self.limits.connections_max:
            victim = next((c for c in order if c._waiting_head and not c._served and c is not self), None) or \
                next((c for c in order if c._waiting_head and c is not self), self)
            log.warning("HTTP gateway: %d connections, more than %d: closing %s", len(order),
                        self.limits.connections_max, "the oldest one waiting for its request head"
                        if victim is not self else "the new one (every other one has a request in hand)")
            victim._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        _order(self.server_state).pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._after_io()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._served = True
        self._after_io()

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse (a Content-Length that is no number, a malformed head): the
        problem document every other 400 is, not uvicorn's text/plain line."""
        body = json.dumps({"type": "https://raftbroker.dev/problems/invalid_http", "title": "Invalid HTTP request",
                           "status": 400, "detail": f"the request is not valid HTTP/1.1: {msg}",
                           "reason": "INVALID_HTTP"}).encode()
        headers = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers,
                                                             reason=b"Bad Request")) or b"")
            self.transport.write(self.conn.send(h11.Data(data=body)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # the connection's state allows no response: just close it
            pass
        self._close()

    def _after_io(self) -> None:
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            self._wait_for_head()  # keeps a deadline already running: trickled bytes do not move it
        elif state is h11.SEND_BODY:
            self._waiting_head = False
            self._arm(self.limits.body_idle_s, "sent nothing of its request body for")
        else:  # the request is in the application's hands (or the connection is ending)
            self._waiting_head = False
            self._disarm()

    def _wait_for_head(self) -> None:
        if not self._waiting_head:
            self._waiting_head = True
            self._arm(self.limits.head_timeout_s, "did not complete a request head within")

    def _arm(self, delay_s: float, what: str) -> None:
        self._disarm()
        self._guard = self.loop.call_later(delay_s, self._expire, what, delay_s)

    def _disarm(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
            self._guard = None

    def _expire(self, what: str, delay_s: float) -> None:
        self._guard = None
        log.debug("HTTP gateway: a connection from %s %s %g s: closed", self.client, what, delay_s)
        self._close()

    def _close(self) -> None:
        self._disarm()
        self._waiting_head = False
        if not self.transport.is_closing():
            self.transport.close()


def _order(server_state: Any) -> dict[GuardedH11Protocol, None]:
    """The server's guarded connections, oldest first."""
    order: dict[GuardedH11Protocol, None] | None = getattr(server_state, "raftbroker_connections", None)
    if order is None:
        order = server_state.raftbroker_connections = {}
    return order


def protocol_class(limits: HttpLimits) -> type[GuardedH11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with ``limits``."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})
