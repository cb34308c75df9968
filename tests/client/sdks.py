"""One test body for both SDKs: :class:`Sdk` drives a sync ``Client`` or an ``AsyncClient`` with the
same code, so a parity test runs the very same calls and assertions against each.

``sdk.c`` is the client; every call is written once and passed through ``sdk.wait`` (the sync
client's value as it is, the asyncio client's awaited on this SDK's event loop), and iterators
through ``sdk.list``/``sdk.take`` (``for`` or ``async for``). The asyncio client lives on one event
loop for the whole module, as a service's would (its channels belong to that loop).
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar, cast, overload

import pytest

from broker.client import BrokerError, Client
from broker.client.aio import AsyncClient

T = TypeVar("T")
SYNC, ASYNC = "sync", "async"


class Sdk:
    """A client of one SDK (``kind``: "sync" or "async") and the means to run its calls to the end."""

    def __init__(self, kind: str, client: Client | AsyncClient, loop: asyncio.AbstractEventLoop) -> None:
        self.kind = kind
        self.c = client
        self._loop = loop

    def __repr__(self) -> str:
        return f"Sdk({self.kind})"

    def name(self, prefix: str) -> str:
        """A resource name of this SDK's own (the two SDKs' runs of one test must not meet)."""
        return f"{prefix}-{self.kind}"

    @overload
    def wait(self, value: Awaitable[T]) -> T: ...

    @overload
    def wait(self, value: T) -> T: ...

    def wait(self, value: object) -> object:
        """``value`` itself (sync), or awaited (asyncio); the asyncio client must return an awaitable."""
        if self.kind == SYNC:
            assert not inspect.isawaitable(value), f"the sync SDK returned an awaitable: {value!r}"
            return value
        assert inspect.isawaitable(value), f"the asyncio SDK returned no awaitable: {value!r}"
        return self._loop.run_until_complete(_awaited(cast(Awaitable[object], value)))

    def list(self, items: Iterable[T] | AsyncIterable[T]) -> builtins.list[T]:
        """Every item, with ``for`` (sync) or ``async for`` (asyncio)."""
        if self.kind == SYNC:
            assert isinstance(items, Iterable), f"the sync SDK returned no iterator: {items!r}"
            return list(items)
        assert isinstance(items, AsyncIterable), f"the asyncio SDK returned no async iterator: {items!r}"
        return self._loop.run_until_complete(_collect(items, None))

    def take(self, items: Iterator[T] | AsyncIterator[T], n: int) -> builtins.list[T]:
        """The next ``n`` items (the iterator stays open)."""
        if self.kind == SYNC:
            assert isinstance(items, Iterator)
            return [next(items) for _ in range(n)]
        assert isinstance(items, AsyncIterator)
        return self._loop.run_until_complete(_collect(items, n))

    def error(self, call: Callable[[], object]) -> BrokerError:
        """The SDK error ``call()`` ends in (awaited, or its iterator read, as the SDK needs)."""
        with pytest.raises(BrokerError) as info:
            value = call()
            if inspect.isawaitable(value):
                self.wait(value)
            elif isinstance(value, Iterable | AsyncIterable):
                self.list(cast(Any, value))
        return info.value


async def _awaited(value: Awaitable[T]) -> T:
    return await value


async def _collect(items: AsyncIterable[T], n: int | None) -> list[T]:
    out: list[T] = []
    if n == 0:
        return out
    async for item in items:
        out.append(item)
        if n is not None and len(out) >= n:
            break
    return out


def said(err: BrokerError) -> tuple[str, str, str, str, dict[str, str]]:
    """What a caller can tell of an error: its type, code, message, reason and metadata."""
    return type(err).__name__, err.code, err.message, err.reason, err.metadata
