"""Replica verification (docs/design/command-formats.md, point 5): real processes, one of them
running a copy of this code whose reset-watermark apply raises (mixed code, as when one pod runs
another commit). Its data diverge with no error anywhere but its own log; ``raftbroker cluster
verify`` names it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import grpc
import pytest

from broker.cli.main import app
from broker.client import BrokerError, Client, NodeInfo
from broker.core import formats
from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, admin_pb2_grpc
from tests.cli.helpers import cli, runner
from tests.cluster.test_route_metrics import sample, scrape
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
FAST = {"RAFTBROKER_HOUSEKEEPING_PERIOD_MS": "100"}  # the leader raises the format this soon
CHECKS = {"RAFTBROKER_VERIFY_REPLICAS_PERIOD_MS": "300"}  # and compares the members' digests this often
APPLY = """        dedup.reset_watermark(batch, meta.topic_id, cmd.dedup_id)
        return existed
"""


def other_code(root: Path) -> Path:
    """A copy of ``broker/`` whose reset-watermark apply raises: a bug fixed (or made) in one node."""
    shutil.copytree(REPO / "broker", root / "broker", ignore=shutil.ignore_patterns("__pycache__"))
    module = root / "broker" / "core" / "state_machine.py"
    source = module.read_text()
    assert source.count(APPLY) == 1, "the patched lines moved: update APPLY"
    module.write_text(source.replace(APPLY, '        raise RuntimeError("this node\'s code differs")\n'))
    return root


def verify(address: str, expect: int) -> dict[str, object]:
    return dict(json.loads(cli(address, "--json", "cluster", "verify", expect=expect).stdout))


def differing_found(address: str) -> dict[str, object] | None:
    """The verification once it reaches an index where some node differs (exit 3), else None (exit 0:
    the slowest node has not applied the command yet)."""
    result = runner.invoke(app, ["--bootstrap", address, "--json", "cluster", "verify"])
    assert result.exit_code in (0, 3), result.output
    return dict(json.loads(result.stdout)) if result.exit_code == 3 else None


def exported(c: DevCluster) -> list[float]:
    """``raftbroker_replicas_differing`` of every node that exports it (the leader only)."""
    found = [sample(scrape(c.metrics_address(i)), "raftbroker_replicas_differing") for i in range(c.nodes)]
    return [v for v in found if v is not None]


def views(c: DevCluster) -> list[NodeInfo | None]:
    return [c.node_status(i) for i in range(c.nodes)]


def test_verify_agrees_on_equal_code_and_names_the_node_whose_code_decides_differently(tmp_path: Path) -> None:
    c = DevCluster(3, tmp_path / "data", env={**os.environ, **FAST, **CHECKS})
    c.tree_by_node[2] = other_code(tmp_path / "tree")
    with c:
        address = c.wait_ready(60)
        client = Client([address])
        try:
            wait_until(lambda: [v and v.cluster_format for v in views(c)] == [formats.CODE_FORMAT] * 3, 60,
                       "every node applies the set_format that begins the digests")
            client.create_topic("v", 2)
            client.publish_batch("v", [b"%d" % i for i in range(100)], dedup_id="p1", first_msg_id=1)
            wait_until(lambda: exported(c) == [0], 30, "only the leader exports raftbroker_replicas_differing")
            agreed = verify(address, 0)
            assert agreed["agreed"] is True and agreed["differing"] == [], agreed
            nodes = agreed["nodes"]
            assert isinstance(nodes, list) and [n["id"] for n in nodes] == ["n1", "n2", "n3"], agreed
            assert len({n["digest"] for n in nodes}) == 1 and all(n["digest"] for n in nodes), agreed
            text = cli(address, "cluster", "verify").stdout
            assert "every member applied the log alike" in text, text

            # n3 records a failure where n1 and n2 apply the command (what the caller sees depends on
            # which node leads); nothing else says the replicas now differ
            try:
                client.reset_watermark("v", "p1")
            except BrokerError:
                assert c.leader() == 2, "only n3's apply fails"
            found = wait_until(lambda: differing_found(address), 60, "the verification reaches the index of the reset")
            assert isinstance(found, dict)
            assert found["differing"] == ["n3"] and found["agreed"] is False, found
            for i in range(3):  # any node answers, and each names n3
                assert verify(c.grpc_address(i), 3)["differing"] == ["n3"]
            text = cli(address, "cluster", "verify", expect=3).stdout
            assert "n3 decided some command differently" in text and "DIFFERS" in text, text

            # without anyone asking: the leader's own comparison counts it and logs it
            wait_until(lambda: exported(c) == [1], 30, "the leader's periodic comparison names n3")
            wait_until(lambda: any("replicas differ: at index" in c.log_path(i).read_text() for i in range(3)), 30,
                       "the leader logs it")
        finally:
            client.close()


def test_before_format_2_and_for_bad_indexes_digests_are_refused_with_a_reason(tmp_path: Path) -> None:
    c = DevCluster(3, tmp_path, env={**os.environ, **FAST, "RAFTBROKER_HOLD_COMMAND_FORMAT": "true"})
    with c:
        address = c.wait_ready(60)
        incomplete = verify(address, 4)
        assert incomplete["agreed"] is False and incomplete["differing"] == [], incomplete
        nodes = incomplete["nodes"]
        assert isinstance(nodes, list) and len(nodes) == 3, incomplete
        assert all("reaches 2" in str(n["error"]) and n["digest"] is None for n in nodes), incomplete
        channel = grpc.insecure_channel(address)
        try:
            admin = admin_pb2_grpc.AdminStub(channel)
            with pytest.raises(grpc.RpcError) as raised:
                admin.ApplyDigest(admin_pb2.ApplyDigestRequest(index=1), timeout=10)
            assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION, raised.value
            assert "begin when the cluster's command format reaches 2" in str(raised.value.details())
        finally:
            channel.close()

    fresh = DevCluster(1, tmp_path / "one", env={**os.environ, **FAST})
    with fresh:
        address = fresh.wait_ready(60)
        wait_until(lambda: (lambda v: v and v.cluster_format == formats.CODE_FORMAT)(fresh.node_status(0)), 60,
                   "the format is raised")
        channel = grpc.insecure_channel(address)
        try:
            admin = admin_pb2_grpc.AdminStub(channel)
            latest = admin.ApplyDigest(admin_pb2.ApplyDigestRequest(), timeout=10)
            assert latest.index >= latest.started_index > 0, latest
            assert latest.started_index > 1, "the set_format follows the leader's first entry"
            for index, words in [(2**64 - 1, "is not applied on this node"),
                                 (latest.started_index - 1, f"began at index {latest.started_index}")]:
                with pytest.raises(grpc.RpcError) as raised:
                    admin.ApplyDigest(admin_pb2.ApplyDigestRequest(index=index), timeout=10)
                assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION, raised.value
                assert words in str(raised.value.details()), raised.value
            assert verify(address, 0)["agreed"] is True
        finally:
            channel.close()
