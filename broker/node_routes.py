"""Routes wired into one node (SPEC §3.4): the replicated route table, the leader's router thread,
the route admin RPCs, the Mirror service and the route metrics.

Construct it right after the state machine (its commands must be registered before the
replicator applies anything), :meth:`wire` it once the submitter, servicers and metrics exist,
then :meth:`start` and :meth:`stop` it with the node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import grpc

from broker.client.mirror import MirrorClient
from broker.client.security import ClientSecurity
from broker.core.route_admin import RouteAdmin
from broker.core.routed_append import TrustedAppender
from broker.core.router import RouteRunner
from broker.core.routes import RouteTable
from broker.core.state_machine import BrokerStateMachine
from broker.core.submitter import CommandSubmitter
from broker.core.topic_log import Limits
from broker.services.log_metrics import RouteCollector
from broker.services.metrics import NodeMetrics
from broker.services.route_service import MIRROR_SERVICE, MirrorServicer, RouteAdminMethods, add_mirror


class NodeRoutes:
    """Everything routes add to a node."""

    def __init__(self, state: BrokerStateMachine) -> None:
        self._state = state
        self.table = RouteTable(state)
        self.runner: RouteRunner | None = None

    def wire(self, *, cluster_id: str, node_id: str, submitter: CommandSubmitter, limits: Limits,
             is_leader: Callable[[], bool], admin: RouteAdminMethods, metrics: NodeMetrics,
             clock_ms: Callable[[], int], remote_security: ClientSecurity | None = None
             ) -> tuple[str, Callable[[grpc.Server], None]]:
        """Create the router and attach the admin methods and metrics; returns the Mirror service
        (name, registrar) for the gRPC server. ``clock_ms`` is the node clock (wall ms) that stamps
        routed appends and route creations. ``remote_security``: TLS and token the router uses
        towards other clusters (``route_client_config``); None: plaintext."""
        appender = TrustedAppender(self._state, submitter, limits, cluster_id, clock_ms=clock_ms)
        self.runner = RouteRunner(self._state, self.table, appender, submitter, is_leader,
                                  functools.partial(MirrorClient, security=remote_security))
        admin.route_admin = RouteAdmin(self._state, self.table, submitter, self.runner, clock_ms=clock_ms)
        metrics.registry.register(RouteCollector(admin.route_admin))
        mirror = MirrorServicer(appender, node_id)
        return MIRROR_SERVICE, lambda server: add_mirror(server, mirror)

    def start(self) -> None:
        assert self.runner is not None, "wire() first"
        self.runner.start()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
