"""Native asyncio SDK of raftbroker, on ``grpc.aio``: ``async with AsyncClient([...]) as c: ...``.

The sync :mod:`broker.client`'s guarantees, and its surface where the two overlap (see
:mod:`.client`): the same method names, arguments and meanings. Deliberate differences, said where
they are: the client's ``on_event(kind, item)`` observes (:data:`Observer`), ``run`` has no ``stop``
event (cancel its task), ``claim`` exists only here. Closing the client ends every ``async for``
over its subscriptions and consumers with ``BrokerError`` (CANCELLED), as the sync client's close
does. Not here yet (the sync client has them): typed topics, the groups admin, ``alter_topic``,
``clear_topic``, routes, ``read_range``, ``end_offsets``, ``offset_for_timestamp``,
``add_node``/``remove_node``, and ``AsyncConsumer.commit``/``unsettled``."""

from broker.client.aio.client import AsyncClient, AsyncHandler, Claimed
from broker.client.aio.routing import AsyncRouter, call_metadata
from broker.client.aio.streams import AsyncBatchSubscription, AsyncConsumer, AsyncMessage, AsyncSubscription, Observer

__all__ = ["AsyncBatchSubscription", "AsyncClient", "AsyncConsumer", "AsyncHandler", "AsyncMessage", "AsyncRouter",
           "AsyncSubscription", "Claimed", "Observer", "call_metadata"]
