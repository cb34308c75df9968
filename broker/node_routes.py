"""Routes wired into one node (SPEC §3.4): the leader's router thread, the route admin service the
``Admin`` route RPCs delegate to, the Mirror service and the route metrics.

In the node's one pass the replicated :class:`broker.core.routes.RouteTable` is created right after
the state machine (its commands must be registered before the replicator applies anything), and
:class:`NodeRoutes` once the submitter and metrics exist; then :meth:`NodeRoutes.start` and
:meth:`NodeRoutes.stop` with the node.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import grpc

from broker.client.mirror import MirrorClient, identify_cluster
from broker.client.security import ClientSecurity
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
from broker.services.route_service import MIRROR_SERVICE, MirrorServicer, add_mirror


class NodeRoutes:
    """The leader-side route services of a node: :attr:`runner` (the router), :attr:`admin`
    (Admin route RPCs) and :attr:`mirror` (the Mirror service, for :meth:`mirror_service`)."""

    def __init__(self, state: BrokerStateMachine, table: RouteTable, *, cluster_id: str, node_id: str,
                 submitter: CommandSubmitter, limits: Limits, is_leader: Callable[[], bool], metrics: NodeMetrics,
                 clock: Clock, remote_security: ClientSecurity | None = None,
                 held: Callable[[int], frozenset[int]] = lambda topic_id: frozenset()) -> None:
        """``clock`` is the node clock whose wall reading stamps routed appends and route creations.
        ``remote_security``: TLS and token the router uses towards other clusters
        (``route_client_config``); None: plaintext. ``held``: the `memory` partitions this node still
        takes back (``RouteRunner``)."""
        self.table = table
        appender = TrustedAppender(state, submitter, limits, cluster_id, clock)
        self.runner = RouteRunner(state, table, appender, submitter, is_leader,
                                  functools.partial(MirrorClient, security=remote_security), held=held)
        self.admin = RouteAdmin(state, table, submitter, clock, self.runner, cluster_id=cluster_id,
                                identify=functools.partial(identify_cluster, security=remote_security))
        metrics.registry.register(RouteCollector(self.admin))
        self.mirror = MirrorServicer(appender, node_id)

    def mirror_service(self) -> tuple[str, Callable[[grpc.Server], None]]:
        """The Mirror service (name, registrar) for the gRPC server."""
        mirror = self.mirror
        return MIRROR_SERVICE, lambda server: add_mirror(server, mirror)

    def start(self) -> None:
        self.runner.start()

    def stop(self) -> None:
        self.runner.stop()
