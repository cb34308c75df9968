"""A real node's metrics port under a flood of idle connections (each sends half a request head and
waits): the node's thread count stays where it was, every idle connection is closed by the head
timeout, Prometheus's scrape is answered meanwhile and afterwards, and only /metrics is served."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.devcluster import DevCluster
from broker.services.metrics_server import DEFAULT_LIMITS
from tests.conftest import closed_by_peer, start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

IDLE_CONNECTIONS = 300
THREADS_SLACK = 8  # the node's own threads come and go a little; one per connection would be 300


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A one-node cluster (its own leader)."""
    c = start_cluster(tmp_path_factory.mktemp("metrics-port"), nodes=1)
    try:
        yield c
    finally:
        c.stop()


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def _scrape(address: str, path: str = "/metrics") -> str:
    return urllib.request.urlopen(f"http://{address}{path}", timeout=5).read().decode()


def _families(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}



def test_idle_connections_hold_no_thread_and_are_closed_while_scrapes_are_answered(node: DevCluster) -> None:
    pid = node.pids[0]
    assert pid is not None
    address = node.metrics_address(0)
    host, _, port = address.rpartition(":")
    assert "raftbroker_raft_term" in _families(_scrape(address))
    baseline = _threads(pid)
    idle: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the blank line that ends the head never comes
            sock.setblocking(False)
            idle.append(sock)
        assert _threads(pid) <= baseline + THREADS_SLACK
        assert "raftbroker_raft_term" in _families(_scrape(address))  # Prometheus is not locked out
        assert _threads(pid) <= baseline + THREADS_SLACK
        wait_until(lambda: all(closed_by_peer(s) for s in idle), DEFAULT_LIMITS.head_timeout_s + 30,
                   f"the node to close all {IDLE_CONNECTIONS} idle connections")
    finally:
        for sock in idle:
            sock.close()
    assert "raftbroker_raft_term" in _families(_scrape(address))
    assert _threads(pid) <= baseline + THREADS_SLACK
    log = node.log_path(0).read_text(errors="replace")
    assert "metrics port: closed connections:" in log and "Traceback" not in log
    assert node.alive(0)


def test_only_the_metrics_path_is_served(node: DevCluster) -> None:
    address = node.metrics_address(0)
    for path in ("/nope", "/", "/metrics/", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError) as err:
            _scrape(address, path)
        assert err.value.code == 404, path
    assert _families(_scrape(address, "/metrics?name[]=raftbroker_subscribers")) == {"raftbroker_subscribers"}
