"""Routes over gRPC: the ``Admin`` route RPCs (mixed into ``AdminServicer``) and the ``Mirror``
service a remote cluster's router appends through. Translation only; the logic is in
``broker.leader.route_admin`` and ``broker.leader.routed_append``."""

from __future__ import annotations

import grpc

from broker.leader.route_admin import RouteAdmin
from broker.leader.route_copies import Copy
from broker.leader.routed_append import TrustedAppender
from broker.services import errors, wire
from broker.v1 import routes_pb2, routes_pb2_grpc


class RouteAdminMethods:
    """``Admin.CreateRoute`` / ``ListRoutes`` / ``DeleteRoute``; the servicer's constructor sets
    :attr:`_route_admin`."""

    _route_admin: RouteAdmin

    @errors.unary
    def CreateRoute(self, request: routes_pb2.CreateRouteRequest, context: grpc.ServicerContext
                    ) -> routes_pb2.RouteInfo:
        return wire.route_info(self._route_admin.create(wire.route_config(request.config)))

    @errors.unary
    def ListRoutes(self, request: routes_pb2.ListRoutesRequest, context: grpc.ServicerContext
                   ) -> routes_pb2.ListRoutesResponse:
        return routes_pb2.ListRoutesResponse(routes=[wire.route_info(v) for v in self._route_admin.list()])

    @errors.unary
    def DeleteRoute(self, request: routes_pb2.DeleteRouteRequest, context: grpc.ServicerContext
                    ) -> routes_pb2.DeleteRouteResponse:
        self._route_admin.delete(request.name)
        return routes_pb2.DeleteRouteResponse()


class MirrorServicer(routes_pb2_grpc.MirrorServicer):
    """What another cluster's router calls: who this cluster is, and appends of copies."""

    def __init__(self, appender: TrustedAppender, node_id: str) -> None:
        self._appender = appender
        self._node_id = node_id

    @errors.unary
    def Identify(self, request: routes_pb2.IdentifyRequest, context: grpc.ServicerContext
                 ) -> routes_pb2.IdentifyResponse:
        return routes_pb2.IdentifyResponse(cluster_id=self._appender.cluster_id, node_id=self._node_id)

    @errors.unary
    def Append(self, request: routes_pb2.MirrorAppendRequest, context: grpc.ServicerContext
               ) -> routes_pb2.MirrorAppendResponse:
        copies = [Copy(r.body, r.partition_key if r.HasField("partition_key") else None, r.source_partition,
                       r.idempotency_key) for r in request.records]
        result = self._appender.append(request.topic, copies, foreign=True)
        return routes_pb2.MirrorAppendResponse(results=[
            routes_pb2.MirrorResult(partition=p, offset=o, duplicate=d) for p, o, _, d in result.placements])


def add_mirror(server: grpc.Server, servicer: MirrorServicer) -> None:
    routes_pb2_grpc.add_MirrorServicer_to_server(servicer, server)


MIRROR_SERVICE = routes_pb2.DESCRIPTOR.services_by_name["Mirror"].full_name
