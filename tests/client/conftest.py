"""Fixtures of the SDK tests: both clients of the module's cluster (:mod:`tests.client.sdks`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from broker.client import Client
from broker.client.aio import AsyncClient
from broker.devcluster import DevCluster
from tests.client.sdks import ASYNC, SYNC, Sdk


@pytest.fixture(scope="module")
def sdks(cluster: DevCluster) -> Iterator[dict[str, Sdk]]:
    """A sync ``Client`` and an ``AsyncClient`` (on an event loop of the module's) of the module's cluster."""
    cluster.wait_ready()
    loop = asyncio.new_event_loop()

    async def open_async() -> AsyncClient:
        return AsyncClient(cluster.addresses, retry_deadline_s=30)

    try:
        with Client(cluster.addresses, retry_deadline_s=30) as sync:
            aio = loop.run_until_complete(open_async())
            try:
                yield {SYNC: Sdk(SYNC, sync, loop), ASYNC: Sdk(ASYNC, aio, loop)}
            finally:
                loop.run_until_complete(aio.close())
    finally:
        _close_loop(loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does at its end: cancel what is left (grpc.aio's own tasks of finished
    calls among them), wait for it, close the async generators, then the loop."""
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()


@pytest.fixture(params=[SYNC, ASYNC])
def sdk(request: pytest.FixtureRequest, sdks: dict[str, Sdk]) -> Sdk:
    """Each SDK in turn: a test taking ``sdk`` runs its body once with each client."""
    return sdks[request.param]
