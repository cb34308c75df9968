"""Typed topics for :class:`broker.client.aio.AsyncClient`: ``await client.topic("videos", Video)``.

The contract of :mod:`broker.client.typed` (read it: when an existing topic's schema is compatible
with the model, how values are written and read), checked, encoded and decoded by its functions;
here ``publish``/``publish_batch`` are awaited and ``subscribe`` is iterated with ``async for``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from pydantic import BaseModel

from broker.client.aio.streams import AsyncSubscription
from broker.client.errors import TopicExists
from broker.client.handlers import log_event
from broker.client.models import Event, PublishResult, PublishResults, Record, TopicInfo
from broker.client.typed import check_model, check_topic_schema, decode, model_records, model_schema, model_value

if TYPE_CHECKING:
    from broker.client.aio.client import AsyncClient

M = TypeVar("M", bound=BaseModel)


class AsyncTypedSubscription(AsyncIterator[M], Generic[M]):
    """Model instances of a subscription (``async for``); :attr:`record` is the record of the last
    one yielded. Events (``skip_forward``, ``reset``, ...) go to ``on_event`` (default: a logged
    warning); a value that does not fit the model raises :class:`SchemaMismatchError`."""

    def __init__(self, subscription: AsyncSubscription, model: type[M],
                 on_event: Callable[[Event], None] | None) -> None:
        self._subscription = subscription
        self._model = model
        self._on_event = on_event or log_event
        self.record: Record | None = None

    def __aiter__(self) -> AsyncTypedSubscription[M]:
        return self

    async def __anext__(self) -> M:
        while True:
            item = await self._subscription.__anext__()
            if isinstance(item, Event):
                self._on_event(item)
                continue
            self.record = item
            return decode(self._model, item)

    async def close(self) -> None:
        await self._subscription.close()

    async def __aenter__(self) -> AsyncTypedSubscription[M]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncTypedTopic(Generic[M]):
    """A topic bound to the Pydantic model ``model`` (:class:`broker.client.typed.TypedTopic`, awaited)."""

    def __init__(self, client: AsyncClient, info: TopicInfo, model: type[M]) -> None:
        self._client = client
        self.info = info
        self.model = model

    @property
    def name(self) -> str:
        return self.info.name

    @classmethod
    async def open(cls, client: AsyncClient, name: str, model: type[M], *, partitions: int = 1,
                   **create_options: Any) -> AsyncTypedTopic[M]:
        """Create ``name`` with ``model``'s schema, or check the existing topic's schema."""
        check_model(model)
        schema = model_schema(model)
        try:
            info = await client.create_topic(name, partitions, schema=schema, **create_options)
        except TopicExists:
            info = await client.describe_topic(name)
        check_topic_schema(info, model, schema)
        return cls(client, info, model)

    async def publish(self, item: M | Mapping[str, Any], *, key: bytes | str | None = None,
                      partition: int | None = None, headers: Mapping[str, str] | None = None,
                      idempotency_key: str | None = None) -> PublishResult:
        """Publish one model instance (or a dict validated into one)."""
        return await self._client.publish(self.name, model_value(self.model, item), key=key, partition=partition,
                                          headers=headers, idempotency_key=idempotency_key)

    async def publish_batch(self, items: Sequence[M | Mapping[str, Any]], *,
                            key: Callable[[M], bytes | str | None] | None = None) -> PublishResults:
        """Publish instances all-or-nothing; ``key(instance)`` picks each record's key."""
        return await self._client.publish_batch(self.name, model_records(self.model, items, key))

    def subscribe(self, *, start: str | int | bytes = "earliest", partition: int | None = None,
                  timestamp_ms: int | None = None, stop_at_end: bool = False, filter: str | None = None,
                  on_event: Callable[[Event], None] | None = None) -> AsyncTypedSubscription[M]:
        """Model instances from a position (see :meth:`AsyncClient.subscribe`); ``async for`` them."""
        subscription = self._client.subscribe(self.name, partition=partition, start=start, timestamp_ms=timestamp_ms,
                                              stop_at_end=stop_at_end, filter=filter)
        return AsyncTypedSubscription(subscription, self.model, on_event)

    def __aiter__(self) -> AsyncIterator[M]:
        """Every instance from the earliest retained one on, then live."""
        return self.subscribe()


class AsyncTypedTopicsMixin:
    """``await AsyncClient.topic(name, Model)``."""

    async def topic(self, name: str, model: type[M], *, partitions: int = 1,
                    **create_options: Any) -> AsyncTypedTopic[M]:
        """Open a typed topic (created with the model's schema if missing); see :mod:`broker.client.typed`."""
        return await AsyncTypedTopic.open(cast("AsyncClient", self), name, model, partitions=partitions,
                                          **create_options)
