"""Reads of group state never go back (SPEC §3.2, §9): a leader cut off from the majority by a
silent partition (packets dropped, connections still open) must not answer ``GroupLag`` from what it
applied before the cut (`make chaos` partition-leader seed 1 saw committed 191 after 202).

The nodes run with long Raft connection and leader-fallback timeouts, so the old leader keeps
believing it leads, with a quorum, for the whole test: without the read barrier it answers the old
position every time, deterministically."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.client import Client
from broker.v1 import admin_pb2, admin_pb2_grpc
from chaos.cluster import ChaosCluster
from chaos.net import make_fabric
from tests.chaos.availability import require_netns
from tests.conftest import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

STALE_WINDOW_ENV = {"RAFTBROKER_RAFT_LEADER_FALLBACK_TIMEOUT_S": "60", "RAFTBROKER_RAFT_CONNECTION_TIMEOUT_S": "60"}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    require_netns()
    fabric = make_fabric("netns", 3, secrets.token_hex(3))
    c = ChaosCluster(3, tmp_path / "cluster", fabric, node_env=STALE_WINDOW_ENV)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        fabric.close()


def _lag_on(address: str) -> admin_pb2.GroupLagResponse:
    with grpc.insecure_channel(address) as channel:
        return admin_pb2_grpc.AdminStub(channel).GroupLag(admin_pb2.GroupLagRequest(topic="t", group="g"), timeout=20)


def test_a_cut_off_leader_does_not_answer_group_positions_from_before_the_cut(cluster: ChaosCluster) -> None:
    old = cluster.wait_leader(60)
    assert old is not None, "no leader"
    with Client(cluster.addresses) as client:
        client.create_topic("t", partitions=1)
        client.groups.create("t", "g", "stream")
        client.publish_batch("t", [f"r{i}".encode() for i in range(10)])
        client.groups.seek("t", "g", 3, partition=0)
        assert _lag_on(cluster.grpc_address(old)).partitions[0].committed == 3

        others = [i for i in range(3) if i != old]
        cluster.fabric.partition([[old], others])
        new = cluster.wait_leader(60, exclude=[old])
        assert new is not None and new != old, "the majority elected no new leader"
        majority = Client([cluster.grpc_address(i) for i in others])
        try:
            wait_until(lambda: _seeked(majority), 60, "a seek through the new leader")
            view = cluster.view(old)
            assert view is not None and view.role == "leader", "the old leader must still believe it leads"

            try:
                answer = _lag_on(cluster.grpc_address(old))
            except grpc.RpcError as err:  # refused: the barrier could not commit
                assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION), err
            else:
                assert answer.partitions[0].committed >= 8, \
                    f"{answer.node} answered committed {answer.partitions[0].committed} at index " \
                    f"{answer.applied_index} after 8 was committed: a stale read"

            fresh = majority.groups.lag("t", "g")
            assert fresh.partitions[0].committed == 8
            assert fresh.node == cluster.grpc_address(new) and fresh.applied_index > 0
        finally:
            majority.close()
        cluster.fabric.heal()


def _seeked(client: Client) -> bool:
    try:
        return client.groups.seek("t", "g", 8, partition=0) == {0: 8}
    except Exception:  # the new leader may still be taking over
        return False
