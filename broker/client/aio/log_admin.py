"""Retention changes, prune and clear (SPEC §2.2) for :class:`broker.client.aio.AsyncClient`: the
sync :class:`broker.client.log_admin.LogAdminMixin`'s calls, built by the same functions, awaited."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from broker.client.aio.routing import AsyncRouter
from broker.client.log_admin import alter_topic_call, check_full_policy, clear_topic_call, prune_call
from broker.client.models import Retention, TopicInfo


class AsyncLogAdminMixin:
    """Methods of :class:`~broker.client.aio.AsyncClient` that delete records or change retention."""

    _router: AsyncRouter
    describe_topic: Callable[[str], Awaitable[TopicInfo]]

    async def alter_topic(self, name: str, *, retention: Mapping[str, int | None] | Retention | None = None,
                          full_policy: str | None = None) -> TopicInfo:
        """Change a topic's retention caps and/or full policy; returns the new description (the
        contract of :meth:`broker.client.Client.alter_topic`: ``retention`` REPLACES all three caps,
        ``None`` keeps them; ``full_policy`` ``None`` keeps the policy)."""
        check_full_policy(full_policy)
        if retention is None:
            retention = (await self.describe_topic(name)).retention
        return await self._router.admin_call(alter_topic_call(name, retention, full_policy))

    async def prune(self, topic: str, before_offset: int | None = None, partition: int | None = None, *,
                    group: str | None = None) -> int:
        """Delete records before ``before_offset`` (or up to a lead group's committed positions: see
        :meth:`broker.client.Client.prune`); returns how many were deleted."""
        return await self._router.admin_call(prune_call(topic, before_offset, partition, group))

    async def clear_topic(self, name: str) -> None:
        """Delete every record of a topic; offsets keep growing from where they were."""
        await self._router.admin_call(clear_topic_call(name))
