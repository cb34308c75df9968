"""The metrics port's HTTP server in-process, with small limits: idle, trickling and unread
connections are closed within their deadlines, their number is capped without a thread each, a
scrape is answered meanwhile, only /metrics is served, and a taken port is a one-line BindFailed."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from broker.services.binding import BindFailed, bind_error
from broker.services.metrics import NodeMetrics
from broker.services.metrics_server import MetricsHttpLimits, MetricsHttpServer
from tests.conftest import closed_by_peer, wait_until

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

LIMITS = MetricsHttpLimits(head_timeout_s=1.0, answer_timeout_s=2.0, connections_max=8, workers=1)
HALF_A_HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # the blank line that ends a head never comes


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("scrapes_seen", "A counter the scrapes look for", registry=registry).inc(3)
    Counter("other", "A counter a name[] filter leaves out", registry=registry).inc()
    return registry


@pytest.fixture
def server() -> Iterator[MetricsHttpServer]:
    srv = MetricsHttpServer("127.0.0.1", 0, _registry(), LIMITS)
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


def _scrape(port: int, path: str = "/metrics") -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).read().decode()


def _counter(text: str) -> float:
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "scrapes_seen_total")


def _connect(port: int, send: bytes = HALF_A_HEAD) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(send)
    return sock



def _threads_named(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix))


def test_idle_connections_beyond_the_cap_close_the_oldest_without_a_thread_each(server: MetricsHttpServer) -> None:
    threads = threading.active_count()
    idle = [_connect(server.port) for _ in range(5 * LIMITS.connections_max)]
    try:
        oldest = idle[:-LIMITS.connections_max]
        wait_until(lambda: all(closed_by_peer(s) for s in oldest), 10, "the oldest idle connections to close")
        assert threading.active_count() == threads
        assert _counter(_scrape(server.port)) == 3  # answered while the cap is full of idle connections
        started = time.monotonic()
        wait_until(lambda: all(closed_by_peer(s) for s in idle), 10, "the head timeout to close the rest")
        assert time.monotonic() - started < LIMITS.head_timeout_s + 2
        assert threading.active_count() == threads
        assert _counter(_scrape(server.port)) == 3
    finally:
        for s in idle:
            s.close()


def test_a_head_trickled_a_byte_at_a_time_is_dropped_at_the_head_timeout(server: MetricsHttpServer) -> None:
    """The timeout runs from the accept, not from the last byte: a trickle does not extend it."""
    sock = _connect(server.port, b"G")
    started = time.monotonic()
    try:
        def dropped() -> bool:
            try:
                sock.send(b"E")  # a byte per poll, far more often than the timeout
            except OSError:
                return True
            return closed_by_peer(sock)

        wait_until(dropped, 10, "the trickled connection to be dropped", interval_s=0.1)
        assert time.monotonic() - started < LIMITS.head_timeout_s + 2
    finally:
        sock.close()


def test_only_metrics_is_served(server: MetricsHttpServer) -> None:
    for path in ("/", "/nope", "/metrics/x", "/-/healthy"):
        with pytest.raises(urllib.error.HTTPError) as err:
            _scrape(server.port, path)
        assert err.value.code == 404, path
    assert "other_total" in _scrape(server.port)
    filtered = _scrape(server.port, "/metrics?name[]=scrapes_seen_total")  # prometheus_client's own filter
    assert _counter(filtered) == 3 and "other_total" not in filtered
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    assert err.value.code == 405


class _Gate:
    """A collector whose collect() waits until the gate opens: scrapes that stay being answered."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def collect(self) -> Iterable[Metric]:
        self.open.wait(20)
        yield GaugeMetricFamily("gate", "Open", value=1)


def test_a_connection_beyond_the_cap_of_connections_being_answered_is_closed_at_once() -> None:
    limits = MetricsHttpLimits(head_timeout_s=5, answer_timeout_s=20, connections_max=2, workers=1)
    registry = CollectorRegistry()
    gate = _Gate()
    registry.register(gate)
    srv = MetricsHttpServer("127.0.0.1", 0, registry, limits)
    srv.start()
    held = [_connect(srv.port, b"GET /metrics HTTP/1.0\r\n\r\n") for _ in range(limits.connections_max)]
    try:
        wait_until(lambda: srv.open_connections() == (0, limits.connections_max, 0), 10, "both scrapes answered")
        with _connect(srv.port, b"") as extra:
            wait_until(lambda: closed_by_peer(extra), 1, "the connection beyond the cap to be closed at once")
        assert srv.open_connections() == (0, limits.connections_max, 0)
        assert _threads_named("metrics-") == 1 + limits.workers
        gate.open.set()
        for sock in held:
            sock.setblocking(True)
            assert b"200 OK" in sock.recv(65536)
    finally:
        gate.open.set()
        for sock in held:
            sock.close()
        srv.close()


BIG_SERIES = 100_000


class _Big:
    """A collector with an answer far larger than the socket buffers of a client that reads nothing."""

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("big", "Many series", labels=["i"])
        for i in range(BIG_SERIES):
            family.add_metric([f"{i:040d}"], i)
        yield family


def test_a_client_that_does_not_read_its_answer_holds_no_worker_and_is_cut_off_at_the_answer_timeout() -> None:
    limits = MetricsHttpLimits(head_timeout_s=1, answer_timeout_s=2, connections_max=4, workers=1)
    registry = CollectorRegistry()
    registry.register(_Big())
    srv = MetricsHttpServer("127.0.0.1", 0, registry, limits)
    srv.start()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        sock.connect(("127.0.0.1", srv.port))
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        wait_until(lambda: srv.open_connections() == (0, 0, 1), 10, "the answer to be written and being sent")
        started = time.monotonic()
        # the only worker is free while the answer waits for its reader: the next scrape is answered
        answer = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics?name[]=nothing", timeout=5).read()
        assert answer == b"" and time.monotonic() - started < limits.answer_timeout_s / 2
        wait_until(lambda: srv.open_connections() == (0, 0, 1), 1, "the scrape's connection to close")
        wait_until(lambda: srv.open_connections() == (0, 0, 0), limits.answer_timeout_s + 5, "the reader to be cut off")
        received = 0
        sock.settimeout(5)
        try:
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass  # cut off with data still unsent: a reset
        assert received < BIG_SERIES * 40  # the answer stopped short: cut off, not completed
    finally:
        sock.close()
        srv.close()


def test_close_frees_the_port_and_ends_the_threads() -> None:
    srv = MetricsHttpServer("127.0.0.1", 0, _registry(), LIMITS)
    srv.start()
    idle = _connect(srv.port)
    assert _threads_named("metrics-") == 1 + LIMITS.workers
    srv.close()
    try:
        assert _threads_named("metrics-") == 0
        assert bind_error(f"127.0.0.1:{srv.port}") == ""
        wait_until(lambda: closed_by_peer(idle), 5, "the idle connection to close")
    finally:
        idle.close()


def test_a_taken_metrics_port_is_a_bind_failure_naming_the_address_and_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        assert "Address already in use" in bind_error(address)
        metrics = NodeMetrics()
        with pytest.raises(BindFailed) as err:
            metrics.serve("127.0.0.1", taken.getsockname()[1])
    message = str(err.value)
    assert address in message and "--metrics" in message and "metrics_address" in message
    assert "Address already in use" in message and "\n" not in message
    assert _threads_named("metrics-") == 0
