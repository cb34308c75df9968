"""The gRPC server of one node: Broker, Admin, health checking and reflection."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from broker.services.admin_service import AdminServicer
from broker.services.broker_service import BrokerServicer
from broker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc

MAX_WORKERS = 64


class GrpcServer:
    """Owns the grpc.Server and its health status."""

    def __init__(self, address: str, broker: BrokerServicer, admin: AdminServicer, max_message_bytes: int,
                 extra: Sequence[tuple[str, Callable[[grpc.Server], None]]] = ()) -> None:
        """``extra``: more services as (full service name, registrar), e.g. the Mirror service."""
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        self._server = grpc.server(ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="grpc"),
                                   options=options, maximum_concurrent_rpcs=MAX_WORKERS * 4)
        broker_pb2_grpc.add_BrokerServicer_to_server(broker, self._server)
        admin_pb2_grpc.add_AdminServicer_to_server(admin, self._server)
        for _, register in extra:
            register(self._server)
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        names = [
            broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name,
            admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
            *(name for name, _ in extra),
            health.SERVICE_NAME,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(names, self._server)
        self._names = names[:2]
        if self._server.add_insecure_port(address) == 0:
            raise OSError(f"cannot bind gRPC address {address}")

    def start(self) -> None:
        self._server.start()
        for name in ["", *self._names]:
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float) -> None:
        self._health.enter_graceful_shutdown()
        self._server.stop(grace_s).wait()
