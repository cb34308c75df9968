"""The HTTP server of a node's metrics port: ``GET /metrics`` answered with prometheus_client's own
exposition, with a bound on the threads, sockets and memory any caller can make it hold.

prometheus_client's ``start_http_server`` gives each connection a thread until the client closes it,
with no timeout: 1,500 connections that sent half a request head held 1,500 threads on a node (36
before) and 150 MB more memory, for as long as they stayed open. Here instead:

- One thread (``metrics-accept``) accepts connections, reads their request heads and sends their
  answers, all without blocking (a selector): a connection holds a socket and its head (at most
  :attr:`MetricsHttpLimits.head_bytes_max` bytes) or its answer, never a thread.
- A head not complete :attr:`~MetricsHttpLimits.head_timeout_s` (5 s) after the accept closes the
  connection: a scrape sends its head at once, so only a slow or idle client is dropped. The timeout
  runs from the accept, not from the last read: a client trickling a byte now and then is dropped too.
- At most :attr:`~MetricsHttpLimits.connections_max` (32) connections at a time. One more closes the
  oldest connection still reading its head: a flood of idle connections cannot lock Prometheus out,
  since a scrape sends its head before 32 more connections arrive. When no connection is reading its
  head (all 32 have sent requests), the new one is closed at once.
- A complete head goes to one of :attr:`~MetricsHttpLimits.workers` (2) threads, which writes the
  answer in memory with the stdlib's wsgiref request handler around prometheus_client's
  ``make_wsgi_app`` (text or OpenMetrics as the Accept header asks, gzip, ``name[]`` filters, 405 for
  methods other than GET and OPTIONS). The accept thread sends it: a client that reads slowly holds
  no worker, and is cut off :attr:`~MetricsHttpLimits.answer_timeout_s` (30 s) after its accept. One
  request per connection (no keep-alive): an answered connection is closed.
- ``/metrics`` only (any query string); any other path gets 404. Nothing uses another path on this
  port: Prometheus, the chart's ServiceMonitor and the tests scrape ``/metrics``; the chart's probes
  ask the gRPC port.
- No TLS and no authentication, as before (docs/security.md): the port carries counters only.

So the port costs the node 3 threads (1 + ``workers``) however many connect, and at most
``connections_max`` sockets, each holding a head of up to 16 KiB or one answer (a scrape's size).
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import queue
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, Any, cast
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

from prometheus_client import make_wsgi_app
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
_POLL_MAX_S = 0.5  # the accept loop wakes at least this often (deadlines, close)
_ACCEPTS_PER_ROUND_MAX = 256  # a flood of connections does not starve the heads already arriving
_REPORT_PERIOD_S = 60.0  # at most one log line per period about closed connections

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


@dataclass(frozen=True)
class MetricsHttpLimits:
    """What a caller of the metrics port can make the node hold (see the module docstring)."""

    head_timeout_s: float = 5.0  # from the accept to the end of the request head
    answer_timeout_s: float = 30.0  # from the accept to the last byte of the answer
    connections_max: int = 32  # open connections (reading their heads, with a worker, or sending answers)
    workers: int = 2  # threads writing the answers to complete requests
    head_bytes_max: int = 16384  # a longer request head closes the connection

    def __post_init__(self) -> None:
        assert 0 < self.head_timeout_s <= self.answer_timeout_s, "the head comes before the answer"
        assert self.connections_max >= 1 and self.workers >= 1 and self.head_bytes_max >= 1024


DEFAULT_LIMITS = MetricsHttpLimits()


def metrics_app(registry: Collector) -> WsgiApp:
    """prometheus_client's WSGI app of ``registry`` on :data:`METRICS_PATH`; 404 on any other path
    (its own app answers every path)."""
    exposition = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found: the metrics are at {METRICS_PATH}\n".encode()]
        return exposition(environ, start_response)

    return app


@dataclass
class _Connection:
    """A connection's progress (accept thread only): its head as read so far, then its answer as left
    to send."""

    accepted_at: float
    head: bytearray = field(default_factory=bytearray)
    unsent: memoryview | None = None


class MetricsHttpServer:
    """Serves :func:`metrics_app` of ``registry`` on ``host:port`` within ``limits``.

    The constructor binds (an ``OSError`` when it cannot); :meth:`start` starts the threads;
    :meth:`close` frees the port and ends them."""

    def __init__(self, host: str, port: int, registry: Collector,
                 limits: MetricsHttpLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._listener = _Listener(host, port)
        self._listener.set_app(metrics_app(registry))
        self._listener.socket.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()  # a worker's answer, or close(), wakes the selector
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._listener.socket, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        # the accept thread's alone: connections reading their heads (oldest first), with a worker, sending
        self._reading: collections.OrderedDict[socket.socket, _Connection] = collections.OrderedDict()
        self._answering: dict[socket.socket, _Connection] = {}
        self._sending: dict[socket.socket, _Connection] = {}
        self._requests: queue.SimpleQueue[tuple[socket.socket, bytes, Any] | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[tuple[socket.socket, bytes]] = queue.SimpleQueue()
        self._closed_counts: collections.Counter[str] = collections.Counter()  # reason -> since the last report
        self._reported_at = -_REPORT_PERIOD_S
        self._stopping = False
        self._sockets_closed = False
        self._threads = [threading.Thread(target=self._accept_loop, name="metrics-accept", daemon=True)]
        self._threads += [threading.Thread(target=self._answer_loop, name=f"metrics-answer-{i}", daemon=True)
                          for i in range(limits.workers)]

    @property
    def port(self) -> int:
        """The port bound (the one asked for, or the kernel's choice for 0)."""
        return int(self._listener.server_address[1])

    def open_connections(self) -> tuple[int, int, int]:
        """(connections reading their request heads, with a worker, sending their answers), about now."""
        return len(self._reading), len(self._answering), len(self._sending)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, close every connection, free the port and end the threads."""
        self._stopping = True
        self._wake()
        for _ in range(self.limits.workers):
            self._requests.put(None)
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout_s)
        if not self._threads[0].is_alive():  # never started (else it closed them as it ended)
            self._close_sockets()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # its buffer is full (the loop wakes anyway), or it is closed
            self._wake_w.send(b"x")

    # -- the accept thread ---------------------------------------------------------------------
    def _accept_loop(self) -> None:
        try:
            while not self._stopping:
                for key, _ in self._selector.select(self._next_wake_s(time.monotonic())):
                    conn = cast(socket.socket, key.fileobj)  # only sockets are registered
                    if conn is self._listener.socket:
                        self._accept()
                    elif conn is self._wake_r:
                        self._wake_r.recv(4096)
                    elif conn in self._reading:
                        self._read_head(conn)
                    elif conn in self._sending:
                        self._send(conn)
                self._take_answers()
                self._expire(time.monotonic())
                self._report()
        except Exception:
            log.exception("metrics port: the accept loop failed; the port no longer answers")
        finally:
            self._close_sockets()

    def _next_wake_s(self, now: float) -> float:
        deadlines = [c.accepted_at + self.limits.answer_timeout_s for c in self._sending.values()]
        if self._reading:
            deadlines.append(next(iter(self._reading.values())).accepted_at + self.limits.head_timeout_s)
        return min(_POLL_MAX_S, max(0.0, min(deadlines, default=now + _POLL_MAX_S) - now))

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_ROUND_MAX):
            try:
                conn, _ = self._listener.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: the next round tries again
                log.warning("metrics port: accept failed: %s", exc)
                return
            if sum(self.open_connections()) >= self.limits.connections_max:
                if not self._reading:  # every connection has sent its request: this one gets nothing
                    self._closed_counts["over the cap, every connection being answered"] += 1
                    conn.close()
                    continue
                self._drop(next(iter(self._reading)), "over the cap: the oldest without a request head")
            conn.setblocking(False)
            self._reading[conn] = _Connection(time.monotonic())
            self._selector.register(conn, selectors.EVENT_READ)

    def _read_head(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, "")  # the client went away
            return
        head = self._reading[conn].head
        head += data
        if b"\r\n\r\n" in head or b"\n\n" in head:  # a whole head: a worker answers it
            self._selector.unregister(conn)
            self._answering[conn] = self._reading.pop(conn)
            self._requests.put((conn, bytes(head), _peer(conn)))
        elif len(head) > self.limits.head_bytes_max:
            self._drop(conn, f"request head over {self.limits.head_bytes_max} bytes")

    def _take_answers(self) -> None:
        """Start sending the answers the workers have written."""
        while True:
            try:
                conn, answer = self._answers.get_nowait()
            except queue.Empty:
                return
            connection = self._answering.pop(conn, None)
            if connection is None:
                continue  # closed meanwhile
            connection.unsent = memoryview(answer)
            self._sending[conn] = connection
            self._selector.register(conn, selectors.EVENT_WRITE)

    def _send(self, conn: socket.socket) -> None:
        connection = self._sending[conn]
        assert connection.unsent is not None
        try:
            sent = conn.send(connection.unsent)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn, "")  # the client went away
            return
        connection.unsent = connection.unsent[sent:]
        if not connection.unsent:
            self._drop(conn, "")  # answered: one request per connection

    def _expire(self, now: float) -> None:
        while self._reading:
            conn, connection = next(iter(self._reading.items()))
            if connection.accepted_at + self.limits.head_timeout_s > now:
                break  # accept order: the rest are younger
            self._drop(conn, f"no request head within {self.limits.head_timeout_s:g} s")
        for conn in [c for c, connection in self._sending.items()
                     if connection.accepted_at + self.limits.answer_timeout_s <= now]:
            self._drop(conn, f"answer not read within {self.limits.answer_timeout_s:g} s")

    def _drop(self, conn: socket.socket, reason: str) -> None:
        """Close ``conn`` (``reason``: why, for the log; "" when it is nothing to report)."""
        if self._reading.pop(conn, None) is not None or self._sending.pop(conn, None) is not None:
            self._selector.unregister(conn)
        self._answering.pop(conn, None)
        if reason:
            self._closed_counts[reason] += 1
        with contextlib.suppress(OSError):  # FIN after what was sent; already reset otherwise
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()

    def _report(self) -> None:
        """One warning per :data:`_REPORT_PERIOD_S` at most, counting the connections closed since."""
        now = time.monotonic()
        if not self._closed_counts or now - self._reported_at < _REPORT_PERIOD_S:
            return
        self._reported_at = now
        counts = ", ".join(f"{n} {reason}" for reason, n in self._closed_counts.most_common())
        self._closed_counts.clear()
        log.warning("metrics port: closed connections: %s", counts)

    def _close_sockets(self) -> None:
        if self._sockets_closed:
            return
        self._sockets_closed = True
        for conn in [*self._reading, *self._answering, *self._sending]:
            self._drop(conn, "")
        self._selector.close()
        self._listener.server_close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the worker threads --------------------------------------------------------------------
    def _answer_loop(self) -> None:
        """Write the answers to the requests, in memory: the accept thread sends them (so a client that
        reads slowly holds no worker)."""
        while (request := self._requests.get()) is not None:
            conn, head, peer = request
            try:
                answer = _RequestHandler(conn, head, peer, self._listener).answer
            except Exception:
                log.exception("metrics port: answering %s failed", peer)
                answer = b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
            self._answers.put((conn, answer))
            self._wake()


class _Listener(WSGIServer):
    """The listening socket (bound here, SO_REUSEADDR) and the WSGI environment its requests share;
    :class:`MetricsHttpServer` accepts on it itself (``serve_forever`` is never called)."""

    request_queue_size = 64  # connections the kernel completes before the accept thread takes them

    def __init__(self, host: str, port: int) -> None:
        family, _, _, _, sockaddr = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        self.address_family = family  # IPv6 hosts too (TCPServer's default is IPv4 only)
        # the handler class is never used: requests are answered by _RequestHandler, given their heads
        super().__init__((str(sockaddr[0]), int(sockaddr[1])), WSGIRequestHandler)

    def server_bind(self) -> None:
        """Bind, and name the server by its address: HTTPServer's reverse DNS look-up (getfqdn) could
        hold up a start for a DNS timeout, for a name nothing here reads."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _RequestHandler(WSGIRequestHandler):
    """Answers the request whose whole ``head`` the accept thread has read from ``conn``: the answer is
    written to :attr:`answer` (bytes), never to ``conn``; errors are logged through ``logging``."""

    def __init__(self, conn: socket.socket, head: bytes, peer: Any, server: _Listener) -> None:
        self._head = head
        self.answer = b""
        super().__init__(conn, peer, server)  # answers the request

    def setup(self) -> None:
        self.rfile = io.BytesIO(self._head)  # a GET has no body; the prometheus app reads none
        self.wfile = io.BytesIO()

    def finish(self) -> None:
        self.answer = self.wfile.getvalue()  # type: ignore[attr-defined]

    def handle(self) -> None:
        """wsgiref's own ``handle``, with :class:`_Answer` to answer."""
        self.raw_requestline = self.rfile.readline(65537)
        if not self.parse_request():  # a malformed request has been answered (400) already
            return
        answer = _Answer(self.rfile, cast(IO[bytes], self.wfile), self.get_stderr(), self.get_environ(),
                         multithread=True)
        answer.request_handler = self
        answer.run(self.server.get_app())  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """A scrape is not logged (one every few seconds per Prometheus server)."""


class _Answer(ServerHandler):
    """wsgiref's answer, its errors logged through ``logging``."""

    request_handler: WSGIRequestHandler  # wsgiref's back-pointer, for its request log line

    def log_exception(self, exc_info: tuple[type[BaseException], BaseException, TracebackType]  # type: ignore[override]
                      ) -> None:
        log.error("metrics port: answering a scrape failed", exc_info=exc_info)


def _peer(conn: socket.socket) -> Any:
    try:
        return conn.getpeername()
    except OSError:
        return ("", 0)


