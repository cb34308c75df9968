"""``raftbroker health ADDR`` (the image's HEALTHCHECK and the chart's readiness probe) against real
nodes: exit 0 on every member of a cluster with a leader; exit 1 with NOT_SERVING once a node is left
without a majority (no leader), and 1 for an address nothing listens on; 2 for a malformed address."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.devcluster import free_base_port
from tests.conftest import start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


FORMS = (("broker.cli.main", "health"), ("broker.cli.health",))  # `raftbroker health`, `raftbroker-health`


def health(address: str, form: tuple[str, ...] = FORMS[0]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *form, "--timeout", "5", address],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def until_exit(address: str, form: tuple[str, ...], code: int, what: str) -> subprocess.CompletedProcess[str]:
    """Run the probe until it exits with ``code``; that run."""
    seen: list[subprocess.CompletedProcess[str]] = []

    def probe() -> bool:
        seen.append(health(address, form))
        return seen[-1].returncode == code

    wait_until(probe, 60, what)
    return seen[-1]


def test_health_follows_membership_of_a_cluster_with_a_leader(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    try:
        for i in range(3):
            for form in FORMS:
                done = until_exit(cluster.grpc_address(i), form, 0, f"node {i} SERVING")
                assert "SERVING" in done.stdout
        cluster.kill(1, signal.SIGKILL)
        cluster.kill(2, signal.SIGKILL)
        for form in FORMS:
            left = until_exit(cluster.grpc_address(0), form, 1, "the lone node NOT_SERVING")
            assert "NOT_SERVING" in left.stderr, left.stderr
    finally:
        cluster.stop()


@pytest.mark.unit
def test_unreachable_and_malformed_addresses() -> None:
    port = free_base_port(1)
    for form in FORMS:
        down = health(f"127.0.0.1:{port}", form)
        assert down.returncode == 1 and "UNAVAILABLE" in down.stderr, down.stderr
        bad = health("no-port", form)
        assert bad.returncode == 2 and "not host:port" in bad.stderr, bad.stderr
