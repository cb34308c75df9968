"""Routes (SPEC §3.4) for :class:`broker.client.aio.AsyncClient`: the sync
:class:`broker.client.routes.RoutesMixin`'s calls, built by the same functions, awaited."""

from __future__ import annotations

from collections.abc import Sequence

from broker.client.aio.routing import AsyncRouter
from broker.client.errors import RouteExists, RouteNotFound
from broker.client.routes import RouteInfo, create_route_call, delete_route_call, find_route, list_routes_call


class AsyncRoutesMixin:
    """Route methods of :class:`~broker.client.aio.AsyncClient`."""

    _router: AsyncRouter

    async def create_route(self, name: str, source: str, target: str, *, filter: str | None = None,
                           partition_key: str | None = None, ops: Sequence[str] | None = None,
                           target_cluster: Sequence[str] | str | None = None) -> RouteInfo:
        """Copy, server side, every matching record of ``source`` into ``target`` (or into another
        cluster with ``target_cluster``): the contract of :meth:`broker.client.Client.create_route`.
        A retry finding the route its lost first attempt created returns that route."""
        call = create_route_call(name, source, target, filter, partition_key, ops, target_cluster)
        try:
            return await self._router.admin_call(call)
        except RouteExists as err:
            if err.after_unknown_outcome:
                return await self.route(name)
            raise

    async def list_routes(self) -> list[RouteInfo]:
        """Every route of the cluster, by name."""
        return await self._router.admin_call(list_routes_call())

    async def route(self, name: str) -> RouteInfo:
        """One route; raises :class:`RouteNotFound`."""
        return find_route(await self.list_routes(), name)

    async def delete_route(self, name: str) -> None:
        """Stop and remove a route (its copies stay in the target); raises :class:`RouteNotFound`."""
        try:
            await self._router.admin_call(delete_route_call(name))
        except RouteNotFound as err:
            if not err.after_unknown_outcome:
                raise
