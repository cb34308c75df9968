"""Native asyncio SDK of raftbroker, on ``grpc.aio``: ``async with AsyncClient([...]) as c: ...``.

The sync :mod:`broker.client`'s guarantees and surface (see :mod:`.client`): the same method names,
arguments, defaults, return types and errors, awaited. That covers typed topics
(``await c.topic(name, Model)``: :class:`AsyncTypedTopic`), the groups admin (``c.groups``:
:class:`AsyncGroups`), ``alter_topic``/``prune``/``clear_topic``, routes, ``end_offsets``,
``offset_for_timestamp``, ``read_range``/``read_range_batches`` (async generators),
``add_node``/``remove_node``, and a consumer's ``commit``/``unsettled``; each call is built by the
same function as the sync one (:mod:`broker.client.calls`). Deliberate differences, said where they
are: the client's ``on_event(kind, item)`` observes (:data:`Observer`), ``run`` has no ``stop``
event (cancel its task), ``claim`` exists only here, and the client takes no client config file
(give ``bootstrap`` and ``security``). Closing the client ends every ``async for`` over its
subscriptions and consumers with ``BrokerError`` (CANCELLED), as the sync client's close does."""

from broker.client.aio.client import AsyncClient, AsyncHandler, Claimed
from broker.client.aio.groups import AsyncGroups
from broker.client.aio.routing import AsyncRouter, call_metadata
from broker.client.aio.streams import AsyncBatchSubscription, AsyncConsumer, AsyncMessage, AsyncSubscription, Observer
from broker.client.aio.typed import AsyncTypedSubscription, AsyncTypedTopic

__all__ = ["AsyncBatchSubscription", "AsyncClient", "AsyncConsumer", "AsyncGroups", "AsyncHandler", "AsyncMessage",
           "AsyncRouter", "AsyncSubscription", "AsyncTypedSubscription", "AsyncTypedTopic", "Claimed", "Observer",
           "call_metadata"]
