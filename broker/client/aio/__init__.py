"""Native asyncio SDK of raftbroker, on ``grpc.aio``: ``async with AsyncClient([...]) as c: ...``.

The same surface and guarantees as the sync :mod:`broker.client` (see :mod:`.client`)."""

from broker.client.aio.client import AsyncClient, AsyncHandler, Claimed
from broker.client.aio.routing import AsyncRouter, call_metadata
from broker.client.aio.streams import AsyncBatchSubscription, AsyncConsumer, AsyncMessage, AsyncSubscription, Observer

__all__ = ["AsyncBatchSubscription", "AsyncClient", "AsyncConsumer", "AsyncHandler", "AsyncMessage", "AsyncRouter",
           "AsyncSubscription", "Claimed", "Observer", "call_metadata"]
