"""gRPC health tells the truth (issue 11 item 7, SPEC §5): a follower cut off from the other two
nodes (both killed) goes NOT_SERVING, and SERVING again once they are back."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def health(address: str, service: str = "") -> int | None:
    """The node's health status for ``service``, None when it does not answer."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                              timeout=5)
        except grpc.RpcError:
            return None
        return int(reply.status)


def test_a_follower_cut_off_from_the_others_is_not_serving_until_they_return(fresh_cluster: DevCluster) -> None:
    c = fresh_cluster
    leader = c.addresses.index(c.wait_ready(60))
    follower = (leader + 1) % c.nodes
    others = [i for i in range(c.nodes) if i != follower]
    address = c.grpc_address(follower)
    for i in range(c.nodes):
        def serving(i: int = i) -> bool:
            return health(c.grpc_address(i)) == SERVING

        wait_until(serving, 30, f"node {i} to be SERVING")
    for i in others:
        c.kill(i)
    wait_until(lambda: health(address) == NOT_SERVING, 60, "the isolated follower to say NOT_SERVING")
    for service in ("broker.v1.Broker", "broker.v1.Admin"):
        assert health(address, service) == NOT_SERVING
    for i in others:
        c.spawn(i)
    wait_until(lambda: health(address) == SERVING, 120, "the follower to be SERVING again")
    assert health(address, "broker.v1.Broker") == SERVING
