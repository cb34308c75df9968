"""The synchronous client: ``Client(["host:port", ...])``.

Every call goes to the leader (found by following ``x-leader`` redirects, or by asking the nodes
for reads), so a caller reads its own writes; failover is retried transparently within
``retry_deadline_s`` (see :mod:`broker.client.routing`). Thread-safe: one client may be shared
by many threads; channels are kept per node address and reused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from broker.client import wire
from broker.client.errors import BrokerError, TopicExists, TopicNotFound, invalid_argument
from broker.client.models import ClusterStatus, OutgoingRecord, PublishResult, Retention, TopicInfo
from broker.client.routing import RetryPolicy, Router
from broker.client.subscription import Subscription
from broker.v1 import admin_pb2, broker_pb2

RecordLike = OutgoingRecord | Mapping[str, Any] | bytes | str
PUBLISH_BATCH_RECORDS_MAX = 10_000


class Client:
    """A connection to a raftbroker cluster. Use as a context manager or call :meth:`close`.

    ``bootstrap``: one or more node addresses (a list, or one comma-separated string).
    ``timeout_s``: limit of one attempt of one call. ``retry_deadline_s``: how long a call keeps
    trying other nodes while there is no reachable leader before raising ``Unavailable``.
    """

    def __init__(
        self,
        bootstrap: Sequence[str] | str,
        *,
        timeout_s: float = 10.0,
        retry_deadline_s: float = 30.0,
    ) -> None:
        addresses = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
        if timeout_s <= 0 or retry_deadline_s < 0:
            raise ValueError("timeout_s must be positive and retry_deadline_s not negative")
        self._router = Router(addresses, RetryPolicy(timeout_s=timeout_s, retry_deadline_s=retry_deadline_s))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every channel; open subscriptions end with an error."""
        self._router.close()

    @property
    def known_addresses(self) -> list[str]:
        """Every node address the client may try: the bootstrap list plus those it learned."""
        return self._router.known_addresses

    @property
    def leader(self) -> str | None:
        """The address of the node believed to lead (None until a call found it)."""
        return self._router.leader

    # -- topics ---------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        retention: Mapping[str, int | None] | Retention | None = None,
        durability: str | None = None,
        full_policy: str | None = None,
    ) -> TopicInfo:
        """Create a topic; raises ``TopicExists`` if it exists, ``InvalidArgument`` for a bad config.

        If an earlier attempt's outcome was unknown (connection lost mid-call) and the retry finds
        the topic existing, that attempt created it: the topic is described and returned.
        """
        request = admin_pb2.CreateTopicRequest(
            config=wire.topic_config(name, partitions, retention, durability, full_policy)
        )
        try:
            info = self._router.call(
                lambda addr, t: self._router.admin(addr).CreateTopic(request, timeout=t),
                write=True,
                what=f"create topic {name}",
            )
        except TopicExists as err:
            if err.after_unknown_outcome:
                return self.describe_topic(name)
            raise
        return wire.topic_info(info)

    def describe_topic(self, name: str) -> TopicInfo:
        """A topic's config and per-partition offsets and sizes; raises ``TopicNotFound``."""
        request = admin_pb2.DescribeTopicRequest(name=name)
        info = self._router.call(
            lambda addr, t: self._router.admin(addr).DescribeTopic(request, timeout=t),
            write=False,
            what=f"describe topic {name}",
        )
        return wire.topic_info(info)

    def list_topics(self) -> list[TopicInfo]:
        """Every topic, sorted by name."""
        response = self._router.call(
            lambda addr, t: self._router.admin(addr).ListTopics(admin_pb2.ListTopicsRequest(), timeout=t),
            write=False,
            what="list topics",
        )
        return sorted((wire.topic_info(t) for t in response.topics), key=lambda t: t.name)

    def drop_topic(self, name: str) -> None:
        """Drop a topic and its records; raises ``TopicNotFound`` unless a lost attempt dropped it."""
        request = admin_pb2.DropTopicRequest(name=name)
        try:
            self._router.call(
                lambda addr, t: self._router.admin(addr).DropTopic(request, timeout=t),
                write=True,
                what=f"drop topic {name}",
            )
        except TopicNotFound as err:
            if not err.after_unknown_outcome:
                raise

    # -- publishing -----------------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PublishResult:
        """Publish one record; returns where it was stored once it is committed by a majority."""
        record = OutgoingRecord(value=value, key=key, partition=partition, headers=dict(headers or {}))
        return self.publish_batch(topic, [record])[0]

    def publish_batch(self, topic: str, records: Sequence[RecordLike]) -> list[PublishResult]:
        """Publish records all-or-nothing; one result per record, in order.

        Records may be :class:`OutgoingRecord`, dicts of its fields, or bare values. Retried on
        failover; a retry after a lost connection may store the batch twice (at-least-once)
        until idempotency keys are attached (see :meth:`_idempotency_keys`).
        """
        batch = [wire.outgoing(r) for r in records]
        if not batch:
            return []
        if len(batch) > PUBLISH_BATCH_RECORDS_MAX:
            raise invalid_argument(f"a batch holds at most {PUBLISH_BATCH_RECORDS_MAX} records, got {len(batch)}")
        keys = self._idempotency_keys(batch)
        request = broker_pb2.PublishRequest(
            topic=topic, records=[wire.publish_record(r, k) for r, k in zip(batch, keys, strict=True)]
        )
        response = self._router.call(
            lambda addr, t: self._router.broker(addr).Publish(request, timeout=t),
            write=True,
            what=f"publish to {topic}",
        )
        if len(response.results) != len(batch):
            raise BrokerError(
                "INTERNAL", f"server answered {len(response.results)} results for {len(batch)} records"
            )
        return [wire.publish_result(r) for r in response.results]

    def _idempotency_keys(self, batch: Sequence[OutgoingRecord]) -> list[str]:
        """The seam for SPEC §4: one key per record, chosen once before the first attempt so
        every retry resends the same keys. Empty keys mean "no deduplication" (today)."""
        return [""] * len(batch)

    # -- consuming ------------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        *,
        partition: int | None = None,
        start: str | int | bytes = "earliest",
        timestamp_ms: int | None = None,
        stop_at_end: bool = False,
        max_batch: int = 0,
    ) -> Subscription:
        """Records and events of ``topic`` (one partition or all) from a position.

        ``start``: "earliest", "latest", an offset, or a record's ``position`` token;
        ``timestamp_ms``: instead, the first record at or after that time. With ``stop_at_end``
        the iterator ends once it has caught up with the log end; otherwise it tails live.
        The iterator resumes transparently after a node failure (see :mod:`.subscription`).
        """
        if max_batch < 0:
            raise invalid_argument(f"max_batch must be >= 0, got {max_batch}")
        if partition is not None and partition < 0:
            raise invalid_argument(f"partition must be >= 0, got {partition}")
        return Subscription(
            self._router,
            topic,
            partition=partition,
            position=wire.position(start, timestamp_ms),
            stop_at_end=stop_at_end,
            max_batch=max_batch,
            partition_count=lambda: self.describe_topic(topic).partition_count,
        )

    # -- cluster --------------------------------------------------------------------------------

    def cluster_status(self) -> ClusterStatus:
        """Every node's role, term, commit and applied index, as the answering node sees them."""
        response = self._router.call(
            lambda addr, t: self._router.admin(addr).ClusterStatus(admin_pb2.ClusterStatusRequest(), timeout=t),
            write=False,
            what="cluster status",
        )
        status = wire.cluster_status(response)
        for node in status.nodes:
            if node.grpc_address:
                self._router.learn(node.grpc_address, is_leader=node.id == status.leader_id and node.reachable)
        return status
