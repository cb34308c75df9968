"""Standard gRPC health checking, server reflection, and PublishStream (SPEC §5)."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2
from tests.cluster.stubs import stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def test_health_and_reflection_are_served_on_every_node(cluster: DevCluster) -> None:
    for address in cluster.addresses:
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "broker.v1.Broker", "broker.v1.Admin"):
                # NOT_SERVING is right while a node has no leader or catches up (an election on a
                # busy machine): every node must come to SERVING, not be so at the first look
                def serving(service: str = service, health: health_pb2_grpc.HealthStub = health) -> bool:
                    reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                    return reply.status == health_pb2.HealthCheckResponse.SERVING

                wait_until(serving, 60, f"{address} to be SERVING for {service!r}")
            refl = reflection_pb2_grpc.ServerReflectionStub(channel)
            answers = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
                list_services="")]), timeout=5))
            names = {s.name for s in answers[0].list_services_response.service}
            assert {"broker.v1.Broker", "broker.v1.Admin", "grpc.health.v1.Health"} <= names


def test_publish_stream_answers_each_request_in_order(cluster: DevCluster) -> None:
    s = stubs(cluster.wait_ready())
    try:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="streamed")))
        requests = [broker_pb2.PublishRequest(topic="streamed", records=[
            broker_pb2.PublishRecord(value=b"%d-%d" % (r, i)) for i in range(10)]) for r in range(20)]
        responses = list(s.broker.PublishStream(iter(requests), timeout=30))
        assert len(responses) == 20
        offsets = [res.offset for resp in responses for res in resp.results]
        assert offsets == list(range(200))
        bad = iter([requests[0], broker_pb2.PublishRequest(topic="missing", records=requests[0].records)])
        with pytest.raises(grpc.RpcError) as info:
            list(s.broker.PublishStream(bad, timeout=30))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        s.close()
