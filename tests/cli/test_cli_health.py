"""``raftbroker health ADDR`` (the image's HEALTHCHECK and the chart's readiness probe) against real
nodes: exit 0 on every member of a cluster with a leader; exit 1 with NOT_SERVING once a node is left
without a majority (no leader), and 1 for an address nothing listens on; 2 for a malformed address.
Against a ``raftbroker dev --secure`` node (TLS, tokens): SERVING only with a client config, and the
chart's membership hook (deploy/membership.py) works with the config's admin token."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.devcluster import free_base_port
from tests.conftest import start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


FORMS = (("broker.cli.launch", "health"), ("broker.cli.health",))  # `raftbroker health`, `raftbroker-health`


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


MEMBERSHIP = Path(__file__).resolve().parents[2] / "deploy" / "membership.py"


def _start_secure_dev(data: Path) -> tuple[subprocess.Popen[str], list[int], Path, list[str]]:
    """``raftbroker dev --nodes 1 --secure``: (process, node pids, client config, gRPC addresses)."""
    cmd = [sys.executable, "-m", "broker.cli.main", "dev", "--nodes", "1", "--secure", "--data-dir", str(data),
           "--base-port", str(free_base_port(1))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    pids: list[int] = []
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # ends when dev exits; pytest-timeout bounds a hang
        lines.append(line)
        pids += [int(p) for p in re.findall(r"\bpid (\d+)", line)]
        if line.startswith("client config: "):
            config = Path(line.removeprefix("client config: ").strip())
            ready = next(x for x in lines if x.startswith("cluster ready: "))
            return proc, pids, config, ready.removeprefix("cluster ready: ").strip().split(",")
    proc.wait(30)
    raise AssertionError("no 'client config:' line:\n" + "".join(lines))


def _stop(proc: subprocess.Popen[str], pids: list[int]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for pid in pids:  # nodes run in sessions of their own: make sure none outlives the test
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_health_and_membership_hook_against_a_tls_token_cluster(tmp_path: Path) -> None:
    """The chart's probes against a secured node (what the pods, the hook Jobs and the helm test pod
    run with the chart's client config): plaintext cannot reach a TLS port, and says so; the client config's CA
    makes the probe SERVING, from ``--client-config`` or ``$RAFTBROKER_CLIENT_CONFIG``; an unreadable
    config is a usage error; the membership hook needs the config's admin token and then succeeds."""
    proc, pids, config, addresses = _start_secure_dev(tmp_path / "dev")
    try:
        address = addresses[0]
        for form in FORMS:
            plain = health(address, form)
            assert plain.returncode == 1 and "the node expects TLS" in plain.stderr, plain.stderr
            assert "--client-config PATH" in plain.stderr, plain.stderr
            assert len(plain.stderr.splitlines()) == 1, plain.stderr  # gRPC's own log lines are not shown
            done = until_exit(address, (*form, "--client-config", str(config)), 0, "SERVING over TLS")
            assert "SERVING" in done.stdout, done.stderr
            env = subprocess.run([sys.executable, "-m", *form, "--timeout", "5", address], capture_output=True,
                                 text=True, timeout=60, stdin=subprocess.DEVNULL,
                                 env={**os.environ, "RAFTBROKER_CLIENT_CONFIG": str(config)})
            assert env.returncode == 0 and "SERVING" in env.stdout, env.stderr
            missing = health(address, (*form, "--client-config", str(tmp_path / "nope.toml")))
            assert missing.returncode == 2 and "nope.toml" in missing.stderr, missing.stderr

        listed = subprocess.run([sys.executable, "-m", "broker.cli.launch", "--bootstrap", address,
                                 "--retry-deadline", "10", "topic", "list"], capture_output=True, text=True,
                                timeout=120, stdin=subprocess.DEVNULL,
                                env={k: v for k, v in os.environ.items() if k != "RAFTBROKER_CLIENT_CONFIG"})
        assert listed.returncode != 0 and "expect TLS" in listed.stderr, listed.stderr
        assert len(listed.stderr.splitlines()) == 1, listed.stderr
        # the node logs no line per plaintext connection (gRPC logs its handshake failures at INFO)
        assert "Handshake failed" not in (tmp_path / "dev" / "n1.log").read_text()

        node = "n1"  # `raftbroker dev` names its nodes n1..nN
        hook = [sys.executable, str(MEMBERSHIP), "--bootstrap", address, "--wait-s", "60",
                "--desired", f"{node}=127.0.0.1:1/{address}", "grow"]
        # without the CA the TLS port cannot be reached at all: retried as a failover would be, for
        # the --retry-deadline-s given (60 s by default)
        no_config = subprocess.run([*hook[:-1], "--retry-deadline-s", "3", "grow"], capture_output=True, text=True,
                                   timeout=120, stdin=subprocess.DEVNULL,
                                   env={k: v for k, v in os.environ.items() if k != "RAFTBROKER_CLIENT_CONFIG"})
        assert no_config.returncode == 1 and "membership: error" in no_config.stderr, no_config.stderr
        grown = subprocess.run([*hook[:-1], "--client-config", str(config), "grow"], capture_output=True, text=True,
                               timeout=120, stdin=subprocess.DEVNULL)
        assert grown.returncode == 0 and f"members now {node}" in grown.stdout, grown.stdout + grown.stderr
    finally:
        _stop(proc, pids)
