"""Routes (SPEC §3.4) for :class:`broker.client.Client`: server-side copies of a topic's matching
records into another topic of the same cluster, or of another cluster (mirroring). The calls
(:mod:`broker.client.calls`) and the lookup by name are shared with the asyncio SDK."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from broker.client.calls import AdminCall, nothing
from broker.client.errors import RouteExists, RouteNotFound, invalid_argument
from broker.client.models import OPS
from broker.client.routing import Router
from broker.reasons import Reason
from broker.v1 import routes_pb2


@dataclass(frozen=True)
class RoutePartition:
    """One source partition of a route: records below ``next_offset`` are routed."""

    partition: int
    next_offset: int
    end_offset: int


@dataclass(frozen=True)
class RouteInfo:
    """A route as the leader reports it. ``lag``: source records not routed yet.
    ``last_error``/``copied``/``skipped``/``lost`` come from the leader's router since it took over."""

    name: str
    source: str
    target: str
    filter: str
    partition_key: str
    ops: tuple[str, ...]
    target_cluster: tuple[str, ...]
    route_id: int
    created_ms: int
    partitions: tuple[RoutePartition, ...]
    lag: int
    last_error: str
    copied: int
    skipped: int
    lost: int = 0  # of skipped: deleted before routed, unreadable, refused by the target for good


def route_info(msg: routes_pb2.RouteInfo) -> RouteInfo:
    c = msg.config
    return RouteInfo(
        name=c.name, source=c.source, target=c.target, filter=c.filter, partition_key=c.partition_key,
        ops=tuple(OPS[op] for op in c.ops if 0 <= op < len(OPS)), target_cluster=tuple(c.target_cluster),
        route_id=msg.route_id, created_ms=msg.created_ms,
        partitions=tuple(RoutePartition(p.partition, p.next_offset, p.end_offset) for p in msg.partitions),
        lag=msg.lag, last_error=msg.last_error, copied=msg.copied, skipped=msg.skipped, lost=msg.lost)


def route_config(name: str, source: str, target: str, filter: str | None, partition_key: str | None,
                 ops: Sequence[str] | None, target_cluster: Sequence[str] | str | None) -> routes_pb2.RouteConfig:
    config = routes_pb2.RouteConfig(name=name, source=source, target=target, filter=filter or "",
                                    partition_key=partition_key or "")
    if isinstance(ops, str):  # iterated, "insert" would be refused letter by letter ("unknown op 'i'")
        raise invalid_argument(f"ops must be a list of op names (e.g. [{ops!r}]), got one str; use {', '.join(OPS)}")
    for op in ops or ():
        if op not in OPS:
            raise invalid_argument(f"unknown op {op!r}; use one of {', '.join(OPS)}")
        config.ops.append(OPS.index(op))
    if isinstance(target_cluster, str):
        target_cluster = target_cluster.split(",")
    config.target_cluster.extend(a.strip() for a in target_cluster or () if a.strip())
    return config


def create_route_call(name: str, source: str, target: str, filter: str | None, partition_key: str | None,
                      ops: Sequence[str] | None, target_cluster: Sequence[str] | str | None) -> AdminCall[RouteInfo]:
    """``CreateRoute``: every argument checked (InvalidArgument) before anything is sent."""
    request = routes_pb2.CreateRouteRequest(
        config=route_config(name, source, target, filter, partition_key, ops, target_cluster))
    return AdminCall("CreateRoute", request, f"create route {name}", route_info)


def list_routes_call() -> AdminCall[list[RouteInfo]]:
    return AdminCall("ListRoutes", routes_pb2.ListRoutesRequest(), "list routes",
                     lambda response: [route_info(r) for r in response.routes], write=False)


def delete_route_call(name: str) -> AdminCall[None]:
    return AdminCall("DeleteRoute", routes_pb2.DeleteRouteRequest(name=name), f"delete route {name}", nothing)


def find_route(routes: Sequence[RouteInfo], name: str) -> RouteInfo:
    """The route called ``name`` among ``routes``; :class:`RouteNotFound` (as the server says it) if none."""
    for info in routes:
        if info.name == name:
            return info
    raise RouteNotFound("NOT_FOUND", f"route {name!r} does not exist", reason=Reason.ROUTE_NOT_FOUND,
                        metadata={"route": name})


class RoutesMixin:
    """Route methods of :class:`~broker.client.Client`."""

    _router: Router

    def create_route(
        self,
        name: str,
        source: str,
        target: str,
        *,
        filter: str | None = None,
        partition_key: str | None = None,
        ops: Sequence[str] | None = None,
        target_cluster: Sequence[str] | str | None = None,
    ) -> RouteInfo:
        """Copy, server side, every record of ``source`` that matches into ``target``, from the
        start of the retained log on, at-least-once (exactly once within the target's dedup
        window) and in order per source partition; copies keep the record's ``origin``.

        ``filter``: CEL over key, headers, op, partition, timestamp_ms and value (as for
        ``subscribe``). ``partition_key``: CEL whose string, bytes or int result (an int as its
        decimal text) is hashed like a key to choose the target partition; without it (or when
        it yields anything else) the record's key is used, and a record without a key keeps its
        source partition number modulo the target's partitions. ``ops``: only these ops
        (``insert``, ``update``, ``delete``, ``tombstone``). ``target_cluster``: addresses of another
        cluster to mirror into; records whose origin is that cluster are never copied (no echo).
        A route closing a cycle of routes inside this cluster is refused (FAILED_PRECONDITION).
        """
        call = create_route_call(name, source, target, filter, partition_key, ops, target_cluster)
        try:
            return self._router.admin_call(call)
        except RouteExists as err:
            if err.after_unknown_outcome:
                return self.route(name)
            raise

    def list_routes(self) -> list[RouteInfo]:
        """Every route of the cluster, by name."""
        return self._router.admin_call(list_routes_call())

    def route(self, name: str) -> RouteInfo:
        """One route; raises :class:`RouteNotFound`."""
        return find_route(self.list_routes(), name)

    def delete_route(self, name: str) -> None:
        """Stop and remove a route (its copies stay in the target); raises :class:`RouteNotFound`."""
        try:
            self._router.admin_call(delete_route_call(name))
        except RouteNotFound as err:
            if not err.after_unknown_outcome:
                raise
