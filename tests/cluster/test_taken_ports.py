"""``raftbroker serve`` with its gRPC or metrics port taken stops with one line naming the address,
the setting that chose it and the reason, exit code 2 and no traceback (grpc's RuntimeError and the
metrics server's OSError came out as tracebacks); with its Raft port taken it says so and waits."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from broker.client import Client
from broker.devcluster import HTTP_PORT_OFFSET, METRICS_PORT_OFFSET, RAFT_PORT_OFFSET, free_base_port
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.mark.parametrize(("taken", "flag", "setting"), [
    ("grpc", "--grpc", "grpc_address"),
    ("metrics", "--metrics", "metrics_address"),
])
def test_a_taken_port_stops_the_node_with_one_line_and_exit_code_2(tmp_path: Path, taken: str, flag: str,
                                                                    setting: str) -> None:
    base = free_base_port(1)
    addresses = {"grpc": f"127.0.0.1:{base}", "raft": f"127.0.0.1:{base + RAFT_PORT_OFFSET}",
                 "metrics": f"127.0.0.1:{base + METRICS_PORT_OFFSET}"}
    with socket.socket() as holder:  # another process's listener, as far as the node can tell
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", int(addresses[taken].rpartition(":")[2])))
        holder.listen()
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli.launch", "serve", "--node-id", "s1", "--data-dir", str(tmp_path),
             "--grpc", addresses["grpc"], "--raft", addresses["raft"], "--metrics", addresses["metrics"]],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
            start_new_session=True)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "Traceback" not in out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cannot listen on {addresses[taken]}, the {'gRPC' if taken == 'grpc' else 'metrics'} "
                      f"address ({flag} / {setting}): Address already in use (another process, or an earlier node "
                      "still running, listens on that port)"], err
    assert err.rstrip().splitlines()[-1] == errors[0]  # the last word
    assert "ready" not in out
    # both ports are checked before Raft starts (its journal directory is made as it starts): a node
    # that cannot serve must not have taken part in an election on its way out
    assert not (tmp_path / "raft").exists()


def test_a_taken_raft_port_is_said_and_the_node_takes_part_once_it_is_free(tmp_path: Path) -> None:
    """pysyncobj binds the Raft port on its tick thread and retries every second: the node keeps
    serving its other ports (a port freed soon is no reason to stop), but it used to do so without a
    word, a follower that no member could reach. Now the first failed bind, and every 30th, is an
    ERROR naming the address, the setting and the reason; once the port is free the node leads."""
    base = free_base_port(1)
    raft = f"127.0.0.1:{base + RAFT_PORT_OFFSET}"
    log = tmp_path / "node.log"
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", base + RAFT_PORT_OFFSET))
    holder.listen()
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli.launch", "serve", "--node-id", "s1", "--data-dir", str(tmp_path / "d"),
             "--grpc", f"127.0.0.1:{base}", "--raft", raft, "--metrics", f"127.0.0.1:{base + METRICS_PORT_OFFSET}"],
            stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        said = (f"raft port: cannot listen on {raft} (--raft / raft_address): Address already in use (another "
                "process, or an earlier node, listens there?)")
        wait_until(lambda: said in log.read_text(errors="replace"), 60, "the node to say its Raft port is taken")
        holder.close()
        with Client([f"127.0.0.1:{base}"], retry_deadline_s=60) as client:
            wait_until(lambda: client.cluster_status().nodes[0].role == "leader", 60, "the node to lead")
        assert "Traceback" not in log.read_text(errors="replace")
    finally:
        holder.close()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_taken_http_address_stops_serve_before_the_node_starts(tmp_path: Path) -> None:
    """uvicorn binds on its own thread and only logs a failure: the node ran on without its gateway,
    after saying it served one."""
    base = free_base_port(1)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", base + HTTP_PORT_OFFSET))
        holder.listen()
        done = subprocess.run(
            [sys.executable, "-m", "broker.cli.launch", "serve", "--node-id", "s1", "--data-dir", str(tmp_path),
             "--grpc", f"127.0.0.1:{base}", "--raft", f"127.0.0.1:{base + RAFT_PORT_OFFSET}",
             "--metrics", f"127.0.0.1:{base + METRICS_PORT_OFFSET}", "--http", f"127.0.0.1:{base + HTTP_PORT_OFFSET}"],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == (
        f"error: cannot listen on 127.0.0.1:{base + HTTP_PORT_OFFSET}, the HTTP gateway's address (--http): Address "
        "already in use (another process, or an earlier node still running, listens on that port)")
