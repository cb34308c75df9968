"""The Helm chart's scaling hooks (deploy/membership.py, run by the pre-upgrade and post-upgrade Jobs)
against a real local cluster: grow 3 -> 4 adds the new node through Admin.AddNode once it answers and
waits until it is caught up; shrink 4 -> 3 removes it through Admin.RemoveNode; both are idempotent;
records written before survive and every member serves them. (No Kubernetes API server is available
here: the Jobs themselves are only rendered and validated, by ``make helm-lint``.)"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli import health
from broker.client import Client, Record
from broker.devcluster import DevCluster
from tests.conftest import start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "membership.py"


def run(bootstrap: str, desired: str, phase: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--bootstrap", bootstrap, "--desired", desired,
                           "--wait-s", "180", phase], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    return proc


def test_grow_and_shrink_change_raft_membership(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    try:
        bootstrap = ",".join(cluster.addresses)

        def spec(n: int) -> str:
            return ",".join(f"{cluster.node_id(i)}={cluster.raft_address(i)}/{cluster.grpc_address(i)}"
                            for i in range(n))

        with Client(bootstrap) as client:
            client.create_topic("scaled", partitions=1)
            for k in range(20):
                client.publish("scaled", f"r{k}".encode(), partition=0)
            assert run(bootstrap, spec(3), "grow").returncode == 0  # nothing to do
            four = spec(4)
            new = cluster.add_node()
            grown = run(bootstrap, four, "grow")
            assert grown.returncode == 0, grown.stdout + grown.stderr
            assert f"adding {cluster.node_id(new)}" in grown.stdout
            ids = {n.id for n in client.cluster_status().nodes}
            assert ids == {cluster.node_id(i) for i in range(4)}
            again = run(bootstrap, four, "grow")
            assert again.returncode == 0 and "adding" not in again.stdout, again.stdout + again.stderr

            shrunk = run(bootstrap, spec(3), "shrink")
            assert shrunk.returncode == 0, shrunk.stdout + shrunk.stderr
            assert f"removing {cluster.node_id(new)}" in shrunk.stdout
            wait_until(lambda: {n.id for n in client.cluster_status().nodes}
                       == {cluster.node_id(i) for i in range(3)}, 60, "three members")
            cluster.kill(new)
            client.publish("scaled", b"after", partition=0)
            for i in range(3):
                with Client(cluster.grpc_address(i)) as one:
                    got = [r.value for r in one.subscribe("scaled", stop_at_end=True) if isinstance(r, Record)]
                    assert got == [f"r{k}".encode() for k in range(20)] + [b"after"]
    finally:
        cluster.stop()


def test_a_grow_whose_new_nodes_would_be_a_majority_is_refused(tmp_path: Path) -> None:
    """docs/deploy.md's restore: one node restored from a backup, then grown. New pods start with
    every desired member as a peer, so two new pods of three elect a leader of their own before the
    grow hook adds them; adding them then merged the two clusters and lost every restored record.
    The pre-upgrade hook (shrink) refuses 1 -> 3 before any pod changes; 1 -> 2 -> 3 keeps the data;
    and grow refuses a node that already serves another cluster."""
    cluster = start_cluster(tmp_path / "c", nodes=1)
    other: DevCluster | None = None
    try:
        bootstrap = cluster.addresses[0]

        def spec(n: int) -> str:
            return ",".join(f"{cluster.node_id(i)}={cluster.raft_address(i)}/{cluster.grpc_address(i)}"
                            for i in range(n))

        with Client(bootstrap) as client:
            client.create_topic("restored", partitions=1)
            for k in range(20):
                client.publish("restored", f"r{k}".encode(), partition=0)
            refused = run(bootstrap, spec(3), "shrink")
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert "would be a majority" in refused.stderr and "to at most 2 members" in refused.stderr

            # a node that serves a cluster of its own (here: another single node) is not added
            other = start_cluster(tmp_path / "other", nodes=1)
            serving = functools.partial(health.check, other.grpc_address(0), 2.0)
            wait_until(lambda: serving()[0], 60, "the other node to serve (a leader of its own, caught up)")
            stranger = f"{cluster.node_id(1)}={other.raft_address(0)}/{other.grpc_address(0)}"
            strange = run(bootstrap, f"{spec(1)},{stranger}", "grow")
            assert strange.returncode == 1 and "serves as a member of another cluster" in strange.stderr, \
                strange.stdout + strange.stderr
            assert {n.id for n in client.cluster_status().nodes} == {cluster.node_id(0)}
            other.stop()
            other = None

            for n in (2, 3):  # one step at a time, as the pre-upgrade hook says
                checked = run(bootstrap, spec(n), "shrink")
                assert checked.returncode == 0, checked.stdout + checked.stderr
                cluster.add_node()  # the new pod: every desired member as a peer
                grown = run(bootstrap, spec(n), "grow")
                assert grown.returncode == 0, grown.stdout + grown.stderr
        for i in range(3):
            with Client(cluster.grpc_address(i)) as one:
                got = [r.value for r in one.subscribe("restored", stop_at_end=True) if isinstance(r, Record)]
                assert got == [f"r{k}".encode() for k in range(20)], i
    finally:
        if other is not None:
            other.stop()
        cluster.stop()


@pytest.mark.unit
def test_bad_desired_list_is_refused() -> None:
    proc = run("127.0.0.1:1", "n1=nonsense", "grow")
    assert proc.returncode == 2 and "expected ID=RAFT_HOST:PORT/GRPC_HOST:PORT" in proc.stderr, proc.stderr
