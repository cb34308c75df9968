"""Routes wired into one node (SPEC §3.4): the replicated route table, the leader's router thread,
the route admin RPCs, the Mirror service and the route metrics.

Construct it right after the state machine (its commands must be registered before the
replicator applies anything), :meth:`wire` it once the submitter, servicers and metrics exist,
then :meth:`start` and :meth:`stop` it with the node.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from broker.client.mirror import MirrorClient
from broker.clock import Clock
from broker.core.routes import RouteTable
from broker.core.state_machine import BrokerStateMachine
from broker.leader.route_admin import RouteAdmin
from broker.leader.routed_append import TrustedAppender
from broker.leader.router import RouteRunner
from broker.leader.submitter import CommandSubmitter
from broker.leader.topic_log import Limits
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
             clock: Clock) -> tuple[str, Callable[[grpc.Server], None]]:
        """Create the router and attach the admin methods and metrics; returns the Mirror service
        (name, registrar) for the gRPC server. ``clock`` is the node clock whose wall reading stamps
        routed appends and route creations."""
        appender = TrustedAppender(self._state, submitter, limits, cluster_id, clock)
        self.runner = RouteRunner(self._state, self.table, appender, submitter, is_leader, MirrorClient)
        admin.route_admin = RouteAdmin(self._state, self.table, submitter, clock, self.runner)
        metrics.registry.register(RouteCollector(admin.route_admin))
        mirror = MirrorServicer(appender, node_id)
        return MIRROR_SERVICE, lambda server: add_mirror(server, mirror)

    def start(self) -> None:
        assert self.runner is not None, "wire() first"
        self.runner.start()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
