"""`raftbroker dev` prints each node's HTTP gateway and serves it (and takes a cluster id); `serve
--http` refuses bad addresses."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from broker.client import Client, Record
from broker.devcluster import free_base_port
from tests.conftest import wait_until
from tests.http.conftest import gateway_up

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_dev_prints_and_serves_the_http_gateway_of_each_node(tmp_path: Path) -> None:
    base = free_base_port(2)
    proc = subprocess.Popen([sys.executable, "-m", "broker.cli.main", "dev", "--nodes", "2", "--data-dir",
                             str(tmp_path), "--base-port", str(base), "--cluster-id", "west"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()

    def forward() -> None:
        for line in proc.stdout or ():
            lines.put(line)

    threading.Thread(target=forward, daemon=True).start()
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 90
        while sum("http http://" in line for line in seen) < 2:
            assert time.monotonic() < deadline, "".join(seen)
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
        node_lines = [line for line in seen if "http http://" in line]
        for i, line in enumerate(node_lines):
            assert f"n{i + 1}: grpc 127.0.0.1:{base + i}" in line
            assert f"http http://127.0.0.1:{base + 300 + i}" in line
        for i in range(2):
            url = f"http://127.0.0.1:{base + 300 + i}/v1/cluster"

            def answers(url: str = url) -> bool:
                try:
                    return httpx.get(url, timeout=5).status_code == 200
                except httpx.HTTPError:
                    return False
            wait_until(answers, 60, f"{url} to answer")
            assert len(httpx.get(url, timeout=10).json()["nodes"]) == 2
        with Client([f"127.0.0.1:{base}"], retry_deadline_s=60) as client:  # --cluster-id reached the nodes
            client.create_topic("origins")
            client.publish("origins", "x")
            (record,) = [r for r in client.subscribe("origins", stop_at_end=True) if isinstance(r, Record)]
            assert record.origin.startswith("west/n"), record.origin
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.parametrize(("address", "message"), [
    ("nonsense", "HOST:PORT"),
    ("10.1.2.3:8080", "not a loopback address"),
])
def test_serve_refuses_a_bad_or_exposed_http_address(tmp_path: Path, address: str, message: str) -> None:
    base = free_base_port(1)
    done = subprocess.run([sys.executable, "-m", "broker.cli.main", "serve", "--node-id", "n1", "--data-dir",
                           str(tmp_path), "--grpc", f"127.0.0.1:{base}", "--raft", f"127.0.0.1:{base + 100}",
                           "--metrics", f"127.0.0.1:{base + 200}", "--http", address],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_serve_with_http_stops_its_gateway_and_exits_zero_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM ends the node and its gateway: the HTTP port closes and the process exits 0 (a gateway
    thread left running into the interpreter's finalization could end the process in SIGABRT)."""
    base = free_base_port(1)
    http = f"127.0.0.1:{base + 300}"
    proc = subprocess.Popen([sys.executable, "-m", "broker.cli.main", "serve", "--node-id", "n1", "--data-dir",
                             str(tmp_path), "--grpc", f"127.0.0.1:{base}", "--raft", f"127.0.0.1:{base + 100}",
                             "--metrics", f"127.0.0.1:{base + 200}", "--http", http],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: gateway_up(http), 90, "the gateway to answer")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr[-2000:]
        assert "did not stop" not in stderr, stderr[-2000:]
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{http}/v1/cluster", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
