"""``raftbroker serve --allocator``: the node runs on jemalloc when the system has it, in the same
process its launcher started (broker/allocator.py re-executes it with ``execve``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.allocator import EXEC_MARK, find_jemalloc, loaded_jemalloc
from broker.client import Client
from broker.client.models import Batch
from broker.devcluster import DevCluster
from tests.conftest import start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

JEMALLOC = find_jemalloc()
needs_jemalloc = pytest.mark.skipif(JEMALLOC is None, reason="no libjemalloc (make test installs it as root)")


def _mapped(pid: int | None) -> str | None:
    assert pid is not None
    return loaded_jemalloc(Path(f"/proc/{pid}/maps").read_text())


@needs_jemalloc
def test_nodes_run_on_jemalloc_by_default_in_the_process_their_launcher_started(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, nodes=3)
    try:
        for i, pid in enumerate(cluster.pids):  # DevCluster's own Popen pids: execve kept them
            assert _mapped(pid) == str(JEMALLOC), f"node {i} (pid {pid}) does not map jemalloc"
            assert f"allocator: jemalloc ({JEMALLOC})" in cluster.log_path(i).read_text()
        with Client(cluster.addresses, timeout_s=10, retry_deadline_s=30) as client:
            client.create_topic("alloc", 2)
            values = [os.urandom(1024) for _ in range(500)]
            client.publish_batch("alloc", values)
            got = [v for batch in client.subscribe_batches("alloc", stop_at_end=True) if isinstance(batch, Batch)
                   for v in batch.values]
            assert sorted(got) == sorted(values)
    finally:
        cluster.stop()


def test_system_allocator_keeps_glibc_malloc(tmp_path: Path) -> None:
    cluster = DevCluster(1, tmp_path, extra_args=["--allocator", "system"])
    cluster.start()
    try:
        cluster.wait_ready(60)
        assert _mapped(cluster.pids[0]) is None
        assert "allocator: glibc malloc (--allocator system)" in cluster.log_path(0).read_text()
    finally:
        cluster.stop()


def test_jemalloc_mode_refuses_to_start_when_the_library_did_not_load(tmp_path: Path) -> None:
    """A preload that did not take (marked as the second run, nothing preloaded): exit 2, no loop."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | {EXEC_MARK: "1",
                                                                       "RAFTBROKER_ALLOCATOR": "jemalloc"}
    done = subprocess.run([sys.executable, "-m", "broker.cli.main", "serve", "--node-id", "n1", "--data-dir",
                           str(tmp_path / "n1")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "error: allocator: jemalloc () did not load" in done.stderr
    assert not (tmp_path / "n1").exists()
