"""``Authorization: Bearer`` reaches the gRPC call as ``authorization`` metadata.

The broker's services do not check tokens yet (another change adds them), so this drives the
gateway against a bare gRPC server that records the metadata of the calls it receives: what is
tested is the gateway's pass-through, over a real HTTP request and a real gRPC call."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures

import grpc
import httpx
import pytest

from broker.http.server import start_in_thread
from broker.v1 import admin_pb2, admin_pb2_grpc
from tests.conftest import wait_until
from tests.http.conftest import gateway_up

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class RecordingAdmin(admin_pb2_grpc.AdminServicer):
    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def ClusterStatus(self, request: admin_pb2.ClusterStatusRequest,  # noqa: N802 - the gRPC method name
                      context: grpc.ServicerContext) -> admin_pb2.ClusterStatusResponse:
        self.seen.append({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        return admin_pb2.ClusterStatusResponse(leader_id="n1", nodes=[admin_pb2.NodeInfo(id="n1", role="leader")])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def recording() -> Iterator[tuple[RecordingAdmin, str]]:
    admin = RecordingAdmin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    http = f"127.0.0.1:{free_port()}"
    gateway = start_in_thread(http, [f"127.0.0.1:{grpc_port}"])
    wait_until(lambda: gateway_up(http), 30, "the gateway")
    try:
        yield admin, http
    finally:
        assert gateway.stop(), "the gateway's thread ended"
        with pytest.raises(httpx.ConnectError):  # stopped: its port is closed, in a process that goes on
            httpx.get(f"http://{http}/openapi.json", timeout=2)
        server.stop(0).wait()


def test_bearer_token_is_passed_to_the_grpc_call(recording: tuple[RecordingAdmin, str]) -> None:
    admin, http = recording
    r = httpx.get(f"http://{http}/v1/cluster", headers={"Authorization": "Bearer s3cret"}, timeout=10)
    assert r.status_code == 200, r.text
    assert admin.seen[-1].get("authorization") == "Bearer s3cret"
    r = httpx.get(f"http://{http}/v1/cluster", timeout=10)
    assert r.status_code == 200 and "authorization" not in admin.seen[-1], "no token leaks between requests"
