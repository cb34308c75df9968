"""A node started on another member's data directory (swapped volumes, a wrong path in a unit file)
is refused before Raft starts: it would answer votes and appends with another member's log and vote,
which can lose acknowledged records (broker/data_dir.py). The refusal is one line and exit 2; the
cluster keeps serving, and the nodes start again once each has its own directory back."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.client import Client
from broker.data_dir import IDENTITY_FILE
from broker.devcluster import METRICS_PORT_OFFSET, RAFT_PORT_OFFSET, DevCluster, free_base_port
from tests.cluster.digests import partition_contents, wait_converged

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

RECORDS = 200


def _exit_code(cluster: DevCluster, i: int, timeout_s: float) -> int:
    proc = cluster.procs[i]
    assert proc is not None
    return proc.wait(timeout_s)


def test_swapped_data_directories_are_refused_and_the_cluster_keeps_every_record(fresh_cluster: DevCluster) -> None:
    cluster = fresh_cluster
    with Client(cluster.addresses, retry_deadline_s=60) as client:
        client.create_topic("swap", partitions=1)
        for k in range(RECORDS):
            client.publish("swap", f"r{k}".encode())
        leader_id = client.cluster_status().leader_id
        a, b = [i for i in range(3) if cluster.node_id(i) != leader_id]
        for i in (a, b):
            assert (cluster.node_data_dir(i) / IDENTITY_FILE).is_file()
        # the two followers stop, and come back on each other's directory
        cluster.kill(a, signal.SIGTERM)
        cluster.kill(b, signal.SIGTERM)
        dir_a, dir_b, spare = cluster.node_data_dir(a), cluster.node_data_dir(b), cluster.data_dir / "spare"
        dir_a.rename(spare)
        dir_b.rename(dir_a)
        spare.rename(dir_b)
        for i in (a, b):
            cluster.spawn(i)
        for i, other in ((a, b), (b, a)):
            assert _exit_code(cluster, i, 90) == 2
            log = cluster.log_path(i).read_text()
            assert (f"error: data directory {cluster.node_data_dir(i)} belongs to node {cluster.node_id(other)!r} "
                    f"of cluster 'local', not to this node, node {cluster.node_id(i)!r} of cluster 'local'") in log
            assert "Traceback" not in log
        # the leader alone has no majority: nothing new is acknowledged, and nothing was taken from it
        # (the refused nodes never joined); each node's own directory back, everything is there
        dir_a.rename(spare)
        dir_b.rename(dir_a)
        spare.rename(dir_b)
        for i in (a, b):
            cluster.spawn(i)
        cluster.wait_ready(60)
        client.publish("swap", b"after")
        expected = [f"r{k}".encode() for k in range(RECORDS)] + [b"after"]
    wait_converged(cluster)
    for i in range(3):
        assert [v for _, v in partition_contents(cluster.grpc_address(i), "swap", 0)] == expected, cluster.node_id(i)


def test_adopting_another_nodes_directory_with_peers_is_refused(fresh_cluster: DevCluster) -> None:
    cluster = fresh_cluster
    cluster.kill(2, signal.SIGTERM)
    command = cluster.command(2)
    at = command.index("--node-id")
    command[at + 1] = "stranger"
    done = subprocess.run([*command, "--adopt-data-dir"], capture_output=True, text=True, timeout=90,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith(
        f"error: data directory {cluster.node_data_dir(2)} belongs to node {cluster.node_id(2)!r} of cluster "
        "'local', and --adopt-data-dir (adopt_data_dir) takes it over only for a node started alone"), done.stderr


def test_a_damaged_identity_file_stops_serve_with_exit_code_3(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / IDENTITY_FILE).write_text("{")
    base = free_base_port(1)
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli.launch", "serve", "--node-id", "n1", "--data-dir", str(data),
         "--grpc", f"127.0.0.1:{base}", "--raft", f"127.0.0.1:{base + RAFT_PORT_OFFSET}",
         "--metrics", f"127.0.0.1:{base + METRICS_PORT_OFFSET}"],
        capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 3, done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith(
        f"error: refusing to start: {data / IDENTITY_FILE}: damaged"), done.stderr
    assert "Traceback" not in done.stderr
