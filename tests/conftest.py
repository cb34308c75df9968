"""Shared fixtures: real clusters of separate processes, torn down by PID."""

from __future__ import annotations

import gc
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.client import Client
from broker.devcluster import DevCluster


def wait_until(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05) -> object:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


def rss_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def closed_by_peer(sock: socket.socket) -> bool:
    """The other end closed ``sock`` (made non-blocking here): a node closing a connection it never
    answers (a half-sent request head, an unnamed Raft peer). False while it is still open."""
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def processes_naming(path: Path) -> list[int]:
    """Running PIDs whose command line names ``path`` (a node names its data directory): how a test
    finds the nodes a command started for itself, to check they are gone."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(path).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def start_cluster(tmp: Path, nodes: int = 3, extra_args: tuple[str, ...] = (), *, http: bool = False,
                  ready: Callable[[DevCluster], object] | None = None) -> DevCluster:
    """A started cluster (``http``: its nodes also serve the HTTP gateway), ready to serve, and
    ``ready(cluster)`` done; stopped again if starting fails."""
    cluster = DevCluster(nodes, tmp, extra_args=extra_args, http=http)
    cluster.start()
    try:
        cluster.wait_ready(60)
        if ready is not None:
            ready(cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A started 3-node cluster shared by one test module (tests must not break it)."""
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def client(cluster: DevCluster) -> Iterator[Client]:
    """An SDK client of the module's cluster that follows a failover for up to 30 s."""
    cluster.wait_ready()
    with Client(cluster.addresses, retry_deadline_s=30) as c:
        yield c


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[DevCluster]:
    """A started 3-node cluster of the test's own, which it may kill and restart freely."""
    c = start_cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def killable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A 3-node cluster of one test module whose tests kill nodes (and restart them afterwards)."""
    c = start_cluster(tmp_path_factory.mktemp("killable"))
    try:
        yield c
    finally:
        c.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Free what the tests left to the cyclic collector while the interpreter is whole.

    The asyncio SDK's closed channels are freed only by the cyclic GC (a probe: the aio poller
    thread ran on after ``async with AsyncClient`` until ``gc.collect()``), and a collection during
    the interpreter's finalization would shut gRPC's aio poller down at the worst moment."""
    gc.collect()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name every thread still running when the tests are over, with where it is.

    A thread left running (a server, a gRPC channel's poller) meets the interpreter's finalization
    after the last test, where a native thread calling back into Python can end the run in SIGABRT
    with every test passed; this line says which one to stop."""
    frames = sys._current_frames()
    left = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if not left:
        return
    terminalreporter.section("threads still running after the tests")
    for t in left:
        frame = frames.get(t.ident or -1)
        where = traceback.format_stack(frame, limit=1)[0].strip().replace("\n", " ") if frame else "?"
        terminalreporter.write_line(f"{t.name} (daemon={t.daemon}): {where}")
