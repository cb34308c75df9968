"""The gRPC server of one node: Broker, Admin, health checking and reflection.

A ``grpc.aio`` server on an event loop of its own thread: uvloop's, on which the leader spends
about 7 % less CPU per publish than on asyncio's own loop (bench/NOTE.md, 2026-11-29). Unary
handlers are sync and run on the call pool (``migration_thread_pool``,
:attr:`StreamRuntime.call_pool`), except ``Publish``, a coroutine that awaits its commit without a
thread; streaming handlers are coroutines that hold no thread while idle
(``broker.services.streams``), so streams cannot starve unary calls or health checks.

Health (SPEC §5): every registered service name is SERVING or NOT_SERVING together, as
``health_check()`` says; a watcher asks it every :data:`HEALTH_PERIOD_S` and updates the status
when it changes (logging why).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import grpc
import uvloop
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from broker.security.node import ServerSecurity
from broker.services.admin_service import AdminServicer
from broker.services.binding import GRPC, BindFailed, bind_error
from broker.services.broker_service import BrokerServicer, add_broker_service
from broker.services.grpc_log import quiet_abandoned_streams
from broker.services.streams import StreamRuntime
from broker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2

log = logging.getLogger(__name__)

HEALTH_PERIOD_S = 0.5
HEALTH_SERVICE_NAME = "grpc.health.v1.Health"

T = TypeVar("T")
# (serving, why not): what the health watcher asks the node
HealthCheck = Callable[[], tuple[bool, str]]


class GrpcServer:
    """Owns the asyncio gRPC server, its event-loop thread and its health status."""

    def __init__(self, address: str, broker: BrokerServicer, admin: AdminServicer, max_message_bytes: int,
                 streams: StreamRuntime, health_check: HealthCheck | None = None,
                 extra: Sequence[tuple[str, Callable[[grpc.aio.Server], None]]] = (),
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 security: ServerSecurity | None = None) -> None:
        """``extra``: more services as (full service name, registrar), e.g. the Mirror service.
        ``interceptors``: server interceptors, e.g. the per-RPC metrics'.
        ``health_check``: None means always SERVING while running. ``security``: TLS credentials and
        the auth interceptor (``broker.security``); None serves plaintext without authentication.
        Raises :class:`~broker.services.binding.BindFailed` when ``address`` cannot be bound."""
        quiet_abandoned_streams()  # a stream's peer gone mid-write is not an ERROR (broker.services.grpc_log)
        self._security = security
        self._streams = streams
        self._health_check = health_check or (lambda: (True, ""))
        self._interceptors = list(interceptors)
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="grpc-loop", daemon=True)
        self._thread.start()
        self._watcher: asyncio.Task[None] | None = None
        self._serving: bool | None = None
        self._names: list[str] = []
        try:
            self._server, self._health = self._run(self._build(address, broker, admin, max_message_bytes, extra))
        except BaseException:
            self._close_loop()
            raise

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the server, its handlers and its streams run on."""
        return self._loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _build(self, address: str, broker: BrokerServicer, admin: AdminServicer, max_message_bytes: int,
                     extra: Sequence[tuple[str, Callable[[grpc.aio.Server], None]]]
                     ) -> tuple[grpc.aio.Server, health_async.HealthServicer]:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        # authentication and authorisation first: a refused call is still counted by the metrics
        interceptors = [*(self._security.interceptors if self._security is not None else []), *self._interceptors]
        server = grpc.aio.server(migration_thread_pool=self._streams.call_pool, options=options,
                                 interceptors=interceptors)
        add_broker_service(broker, server)
        admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
        for _, register in extra:
            register(server)
        health = health_async.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        names = [
            broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name,
            admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
            *(name for name, _ in extra),
            HEALTH_SERVICE_NAME,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(names, server)
        self._names = names[:2]
        credentials = self._security.credentials if self._security is not None else None
        try:
            bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        except RuntimeError:  # grpc's "Failed to bind to address": the OS's reason is only in its log line
            bound = 0
        if bound == 0:
            raise BindFailed(GRPC, address, bind_error(address) or "gRPC could not bind it (its log line says why)")
        return server, health

    def start(self) -> None:
        self._run(self._start())

    async def _start(self) -> None:
        self._streams.start(asyncio.get_running_loop())
        await self._server.start()
        await self._update_health()
        self._watcher = asyncio.get_running_loop().create_task(self._watch_health())

    async def _update_health(self) -> None:
        serving, why = await asyncio.wrap_future(self._streams.call_pool.submit(self._health_check))
        if serving == self._serving:
            return
        if serving:
            log.info("health: SERVING")
        else:
            log.warning("health: NOT_SERVING (%s)", why)
        self._serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self._names]:
            await self._health.set(name, status)

    async def _watch_health(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_PERIOD_S)
            try:
                await self._update_health()
            except Exception:  # noqa: BLE001 - a failing check must not end the watcher
                log.exception("health check failed")

    def stop(self, grace_s: float) -> None:
        """Say NOT_SERVING, give open calls and streams ``grace_s`` to finish, then stop."""
        try:
            self._run(self._stop(grace_s))
        finally:
            self._streams.stop()
            self._close_loop()

    async def _stop(self, grace_s: float) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
