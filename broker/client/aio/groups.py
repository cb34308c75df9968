"""Consumer-group administration for :class:`broker.client.aio.AsyncClient`: ``client.groups``.

The sync :class:`broker.client.groups.Groups`, method for method: the same names, arguments,
return types and errors, each call built by the same function of :mod:`broker.client.groups` and
awaited on the leader (redirects followed, failovers retried, as every call of the client).
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence

from broker.client.aio.routing import AsyncRouter
from broker.client.errors import GroupNotFound
from broker.client.groups import (
    DeadLetter,
    DeadLettersRetried,
    GroupInfo,
    GroupLag,
    create_call,
    dead_letters_call,
    delete_call,
    describe_call,
    lag_call,
    list_call,
    mark_call,
    pause_call,
    purge_call,
    resume_call,
    retry_all_call,
    retry_call,
    seek_call,
)


class AsyncGroups:
    """``client.groups``: create, describe, seek/replay, lag, pause/resume, dead letters, delete
    (the contracts of :class:`broker.client.groups.Groups`)."""

    def __init__(self, router: AsyncRouter) -> None:
        self._router = router

    async def create(self, topic: str, group: str, mode: str | None = None, **config: object) -> GroupInfo:
        """Create a group (``mode`` and the other group options; ``start`` or ``timestamp_ms`` say
        where it starts). Raises ``GroupExists`` (ALREADY_EXISTS) if it exists."""
        return await self._router.admin_call(create_call(topic, group, mode, config))

    async def describe(self, topic: str, group: str) -> GroupInfo:
        """The group's config as stored, and (stream mode) its members; raises ``GroupNotFound``."""
        return await self._router.admin_call(describe_call(topic, group))

    async def list(self, topic: str) -> builtins.list[GroupInfo]:
        """Every group of ``topic``."""
        return await self._router.admin_call(list_call(topic))

    async def delete(self, topic: str, group: str) -> None:
        """Delete the group's state (its dead-letter topic stays: drop it like any topic)."""
        try:
            await self._router.admin_call(delete_call(topic, group))
        except GroupNotFound as err:
            if not err.after_unknown_outcome:
                raise

    async def seek(self, topic: str, group: str, to: str | int | bytes = "earliest", *,
                   timestamp_ms: int | None = None, partition: int | None = None) -> dict[int, int]:
        """Move the group's committed position (:meth:`broker.client.groups.Groups.seek`); returns
        the new committed offset per partition."""
        return await self._router.admin_call(seek_call(topic, group, to, timestamp_ms, partition))

    async def replay(self, topic: str, group: str, timestamp_ms: int, partition: int | None = None) -> dict[int, int]:
        """Re-deliver everything from ``timestamp_ms`` on (a seek to that time)."""
        return await self.seek(topic, group, timestamp_ms=timestamp_ms, partition=partition)

    async def lag(self, topic: str, group: str) -> GroupLag:
        """The group's lag, leases, retries and dead letters per partition, as the leader has them."""
        return await self._router.admin_call(lag_call(topic, group))

    async def mark(self, topic: str, group: str, role: str) -> GroupInfo:
        """Set the group's prune role: "lead", "protect" or "none" (:meth:`broker.client.groups.Groups.mark`)."""
        return await self._router.admin_call(mark_call(topic, group, role))

    async def pause(self, topic: str, group: str | None = None) -> builtins.list[str]:
        """Stop deliveries to ``group`` (or to every group of ``topic``); returns the groups changed."""
        return await self._router.admin_call(pause_call(topic, group))

    async def resume(self, topic: str, group: str | None = None) -> builtins.list[str]:
        """Deliver to ``group`` (or to every group of ``topic``) again; returns the groups changed."""
        return await self._router.admin_call(resume_call(topic, group))

    async def dead_letters(self, topic: str, group: str, *, limit: int = 100, partition: int | None = None,
                           after_offset: int | None = None) -> builtins.list[DeadLetter]:
        """Dead letters in (partition, offset) order; page with ``partition`` + ``after_offset``."""
        return await self._router.admin_call(dead_letters_call(topic, group, limit, partition, after_offset))

    async def retry_dead_letters(self, topic: str, group: str,
                                 messages: Sequence[tuple[int, int]]) -> DeadLettersRetried:
        """Deliver these dead letters ((partition, offset) pairs) again; those whose records were
        pruned stay dead (``pruned``)."""
        return await self._router.admin_call(retry_call(topic, group, messages))

    async def retry_all_dead_letters(self, topic: str, group: str) -> DeadLettersRetried:
        """Deliver every dead letter of ``group`` again, but those whose records were pruned."""
        return await self._router.admin_call(retry_all_call(topic, group))

    async def purge_dead_letters(self, topic: str, group: str) -> int:
        """Forget the group's dead letters (their copies stay in the dead-letter topic); returns how many."""
        return await self._router.admin_call(purge_call(topic, group))
