"""The synchronous client: ``Client(["host:port", ...])``.

Every call goes to the leader (found by following ``x-leader`` redirects, or by asking the nodes
for reads), so a caller reads its own writes; failover is retried transparently within
``retry_deadline_s`` (see :mod:`broker.client.routing`). Thread-safe: one client may be shared
by many threads; channels are kept per node address and reused.

Publishing is exactly-once in effect (SPEC §4, §9). By default a batch is sent as the next range
of messages of one of the client's producer sessions (a ``dedup_id`` of its own and a sequence,
:mod:`broker.client.sessions`): the broker checks and stores it once per batch, and every retry of a
call resends the same ``(dedup_id, first_msg_id)``, so a retry whose earlier attempt was applied
unseen stores nothing new and answers the original places with ``duplicate=True``. The broker
forgets a session idle for longer than the topic's dedup window (the client then opens a new one);
keep ``retry_deadline_s`` below that window, as for keys. Records that bring their own
``idempotency_key`` are sent with per-record keys instead (a record without one in such a batch
gets a random key), deduplicated within the topic's dedup window (``dedup_window_ms``, default 2
minutes; keep ``retry_deadline_s`` below it). A call that finally raises leaves its outcome unknown
(``after_unknown_outcome``); to repeat it without risking a second copy, publish again with your
own keys (or a ``dedup_id``).

Concurrent ``publish`` calls to one topic share requests, one request in flight per topic
(:mod:`broker.client.coalescing`; ``coalesce_publishes=False`` turns it off), and those requests
travel on one ``PublishStream`` per topic, cheaper for the node than a call each
(:mod:`broker.client.publish_streams`; ``stream_publishes=False``: unary calls).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

from broker.client import checks, wire
from broker.client.coalescing import ThreadCoalescer
from broker.client.consumer import GROUP_FILTER_REFUSED, Consumer
from broker.client.errors import TopicExists, TopicNotFound, invalid_argument
from broker.client.handlers import GroupsMixin
from broker.client.log_admin import LogAdminMixin
from broker.client.membership import add_node_call, remove_node_call
from broker.client.models import (
    ClusterStatus,
    OutgoingRecord,
    PublishResult,
    PublishResults,
    ReplicaVerification,
    Retention,
    TopicInfo,
    Watermark,
)
from broker.client.publish_streams import PublishStreams
from broker.client.ranges import RangesMixin
from broker.client.routes import RoutesMixin
from broker.client.routing import RetryPolicy, Router
from broker.client.security import ClientSecurity, load_client_config
from broker.client.sessions import SessionPool, publish_in_session
from broker.client.subscription import BatchSubscription, Subscription
from broker.client.typed import TypedTopicsMixin
from broker.v1 import admin_pb2, broker_pb2

RecordLike = OutgoingRecord | Mapping[str, Any] | bytes | str
PUBLISH_BATCH_RECORDS_MAX = wire.PUBLISH_BATCH_RECORDS_MAX


class Client(LogAdminMixin, RangesMixin, RoutesMixin, TypedTopicsMixin, GroupsMixin):
    """A connection to a raftbroker cluster. Use as a context manager or call :meth:`close`.

    ``bootstrap``: one or more node addresses (a list, or one comma-separated string).
    ``timeout_s``: limit of one attempt of one call. ``retry_deadline_s``: how long a call keeps
    trying other nodes while there is no reachable leader (a failover) before raising ``Unavailable``.
    ``no_quorum_grace_s``: how long a call waits once every node it can reach says it has no
    quorum and the others cannot be reached (a lost majority, not a failover) before raising
    ``Unavailable`` "no quorum" (at most 60 s; a caller that must ride out a restart of a majority of
    the nodes raises it, the retry deadline still bounds the call).
    ``security``: TLS and token (:class:`~broker.client.security.ClientSecurity`); ``client_config``:
    a client config file (``raftbroker dev --secure`` prints one) giving them and, when ``bootstrap``
    is None, the addresses; without either, ``$RAFTBROKER_CLIENT_CONFIG`` is read if set.
    """

    def __init__(
        self,
        bootstrap: Sequence[str] | str | None = None,
        *,
        timeout_s: float = 10.0,
        retry_deadline_s: float = 30.0,
        no_quorum_grace_s: float = 1.0,
        security: ClientSecurity | None = None,
        client_config: str | Path | None = None,
        coalesce_publishes: bool = True,
        stream_publishes: bool = True,
    ) -> None:
        """``coalesce_publishes``: :meth:`publish` calls made from several threads to one topic go
        together, one request in flight per topic (:mod:`broker.client.coalescing`); False sends each
        as its own call. ``stream_publishes``: those coalesced requests travel on a ``PublishStream``
        per topic (:mod:`broker.client.publish_streams`); False: one unary ``Publish`` call each."""
        if security is None:
            loaded = load_client_config(client_config)
            if loaded is not None:
                security = loaded.security
                bootstrap = bootstrap if bootstrap is not None else loaded.bootstrap
        if bootstrap is None:
            raise ValueError("give bootstrap addresses (or a client config file that lists them)")
        addresses = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
        self._router = Router(addresses, RetryPolicy(timeout_s=timeout_s, retry_deadline_s=retry_deadline_s,
                                                     no_quorum_grace_s=no_quorum_grace_s), security)
        self._sessions = SessionPool()
        self._streams = PublishStreams(self._router) if stream_publishes else None
        self._coalescer = ThreadCoalescer(self._publish_coalesced) if coalesce_publishes else None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every channel; open subscriptions end with an error."""
        if self._streams is not None:
            self._streams.close()
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
        dedup_window_ms: int | None = None,
        schema: Mapping[str, Any] | str | None = None,
        dedup_fields: Sequence[str] | None = None,
        exist_ok: bool = False,
    ) -> TopicInfo:
        """Create a topic; raises ``TopicExists`` if it exists, ``InvalidArgument`` for a bad config.

        ``exist_ok=True``: a topic of that name that already exists with the same partition count
        (and the same durability, full policy, dedup window, schema and dedup fields where they are
        given here) is described and returned, so setup code can run again; one that differs still
        raises ``TopicExists``, naming the differences. Retention is not compared (it can be altered).

        ``dedup_window_ms``: how long an idempotency key is remembered (``None``: the server
        default, 120000; ``-1``: forever).
        ``schema``: a JSON Schema (dict or JSON text) every value must satisfy (values are JSON).
        ``dedup_fields``: JSON fields (dotted paths reach into objects) whose values form a
        permanent unique key; publishing a repeat raises :class:`DuplicateMessageError`.
        If an earlier attempt's outcome was unknown (connection lost mid-call) and the retry finds
        the topic existing, that attempt created it: the topic is described and returned.
        """
        request = wire.create_topic_request(name, partitions, retention, durability, full_policy, dedup_window_ms,
                                            schema, dedup_fields)
        try:
            info = self._router.call(
                lambda addr, t: self._router.admin(addr).CreateTopic(request, timeout=t),
                write=True,
                what=f"create topic {name}",
            )
        except TopicExists as err:
            if err.after_unknown_outcome:
                return self.describe_topic(name)
            if not exist_ok:
                raise
            existing = self.describe_topic(name)
            differences = wire.config_differences(request.config, existing)
            if differences:
                raise wire.exists_differently(err, differences) from None
            return existing
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
        idempotency_key: str | None = None,
        dedup_id: str | None = None,
        msg_id: int | None = None,
    ) -> PublishResult:
        """Publish one record; returns where it is stored once it is committed by a majority.

        ``idempotency_key``: yours, to deduplicate repeats across calls (``None``: the client's
        producer session deduplicates this call's own retries). ``dedup_id`` + ``msg_id``: your
        own producer session (see :meth:`publish_batch`). ``result.duplicate`` tells whether the
        broker had it already. Calls made from other threads while this topic's request is in
        flight go together in the next request (:mod:`broker.client.coalescing`); each caller gets
        its own result or error.
        """
        record = OutgoingRecord(value=value, key=key, partition=partition, headers=checks.headers_of(headers),
                                idempotency_key=idempotency_key, msg_id=msg_id)
        if self._coalescer is None or idempotency_key is not None or dedup_id is not None or msg_id is not None:
            return self.publish_batch(topic, [record], dedup_id=dedup_id)[0]
        return self._coalescer.publish(topic, record)

    def publish_batch(
        self,
        topic: str,
        records: Sequence[RecordLike],
        *,
        dedup_id: str | None = None,
        first_msg_id: int | None = None,
    ) -> PublishResults:
        """Publish records all-or-nothing; one result per record, in request order.

        Records may be :class:`OutgoingRecord`, dicts of its fields (``value``, ``key``,
        ``partition``, ``headers``, ``op``, ``idempotency_key``, ``msg_id``), or bare values. ``records``
        is a list of them: one bare str, bytes or dict is refused (InvalidArgument), not split up.

        Exactly-once in effect. Without caller keys (no ``idempotency_key`` on any record, no
        ``dedup_id``) the batch is one range of one of the client's producer sessions (see the
        module docstring): retries on failover (a redirect, no leader, a dropped connection, a
        deadline) resend the same range, so the broker stores each record once, and a retry of
        an attempt applied unseen answers the original places with ``duplicate=True``. Concurrent
        calls from several threads use different sessions. With an ``idempotency_key`` on any
        record, each record is sent with its key or a random one (uuid4 hex) chosen once before
        the first attempt; ``duplicate`` then marks a record the broker already had, at the first
        copy's place, and repeats of a key inside one batch are deduplicated too.

        Producer session (SPEC §4 watermarks): with ``dedup_id``, every record has a message id
        whose absolute value rises by exactly one per record, within the batch and from one
        batch to the next (1, -2, 3, 4 is valid). Give either ``first_msg_id`` (>= 1: the records
        get ``first_msg_id``, ``first_msg_id + 1``, ...) or a ``msg_id`` on every record (to choose
        signs). A record whose ``|msg_id|`` is at or below the session's replicated watermark is
        discarded and reported ``duplicate=True`` with ``offset`` 0 (no original place is kept);
        a gap or a repeat inside the batch raises :class:`InvalidArgument` before sending. The
        watermark is what deduplicates such a batch: its records get no generated key (unless one
        of them brings its own ``idempotency_key``).
        """
        return self._publish_batch(topic, records, dedup_id, first_msg_id, None)

    def _publish_coalesced(self, topic: str, records: Sequence[RecordLike]) -> PublishResults:
        """One request of the coalescer: on the topic's ``PublishStream`` (unless ``stream_publishes=False``)."""
        return self._publish_batch(topic, records, None, None, self._streams)

    def _publish_batch(self, topic: str, records: Sequence[RecordLike], dedup_id: str | None,
                       first_msg_id: int | None, streams: PublishStreams | None) -> PublishResults:
        """``streams``: send on them (the coalescer's requests), else as a unary call."""
        call = wire.publish_request(topic, records, dedup_id, first_msg_id)
        if call is None:
            return PublishResults(0, list)

        def send(data: bytes) -> broker_pb2.PublishResponse:
            if streams is not None:
                return self._router.call(lambda addr, t: streams.publish(addr, topic, data, t),
                                         write=True, what=f"publish to {topic}")
            return self._router.call(lambda addr, t: self._router.publisher(addr).Publish(data, timeout=t),
                                     write=True, what=f"publish to {topic}")

        response = publish_in_session(self._sessions, call, send) if call.in_session else send(call.data())
        return wire.publish_results(response, call.count, call.keys)

    # -- producer-session watermarks --------------------------------------------------------------

    def get_watermarks(self, topic: str) -> list[Watermark]:
        """Every producer session's high watermark on ``topic`` (the highest ``|msg_id|`` stored
        per ``dedup_id``), as the leader has applied them, in dedup_id order; raises
        ``TopicNotFound``. Asked page by page (``wire.WATERMARKS_PAGE``), so no answer outgrows a
        message however many sessions the topic keeps."""
        marks: list[Watermark] = []
        while True:
            request = admin_pb2.GetWatermarksRequest(topic=topic, limit=wire.WATERMARKS_PAGE,
                                                     after_dedup_id=marks[-1].dedup_id if marks else "")
            response = self._router.call(
                lambda addr, t: self._router.admin(addr).GetWatermarks(request, timeout=t),  # noqa: B023
                write=False,
                what=f"get watermarks of {topic}",
            )
            marks += [wire.watermark(m) for m in response.watermarks]
            if not response.more or not response.watermarks:
                return marks

    def reset_watermark(self, topic: str, dedup_id: str) -> bool:
        """Forget ``dedup_id``'s watermark on ``topic`` (replicated): its next message may start
        again at 1. Returns whether there was one: resetting an unknown ``dedup_id`` changes nothing
        and returns ``False`` (so may a call retried after a failover whose first attempt did reset
        it). Raises ``TopicNotFound``."""
        request = admin_pb2.ResetWatermarkRequest(topic=topic, dedup_id=wire.check_id(dedup_id, "dedup_id"))
        response = self._router.call(
            lambda addr, t: self._router.admin(addr).ResetWatermark(request, timeout=t),
            write=True,
            what=f"reset watermark {dedup_id} of {topic}",
        )
        return bool(response.existed)

    # -- consuming ------------------------------------------------------------------------------

    @overload
    def subscribe(self, topic: str, *, group: None = None, **options: Any) -> Subscription: ...

    @overload
    def subscribe(self, topic: str, *, group: str, **options: Any) -> Consumer: ...

    def subscribe(
        self,
        topic: str,
        *,
        group: str | None = None,
        partition: int | None = None,
        start: str | int | bytes = "earliest",
        timestamp_ms: int | None = None,
        stop_at_end: bool = False,
        max_batch: int = 0,
        filter: str | None = None,
        **group_options: Any,
    ) -> Subscription | Consumer:
        """Records and events of ``topic`` (one partition or all) from a position.

        ``start``: "earliest", "latest", an offset, or a record's ``position`` token;
        ``timestamp_ms``: instead, the first record at or after that time. With ``stop_at_end``
        the iterator ends once it has caught up with the log end; otherwise it tails live.
        The iterator resumes transparently after a node failure (see :mod:`.subscription`).
        With ``group``: a :class:`Consumer`, a member of that consumer group receiving leased
        messages to ``ack``/``nack``/``extend``/``discard`` (see :mod:`broker.client.consumer`);
        ``mode`` ("queue" or "stream") and the group options (``visibility_timeout_ms``,
        ``backoff``, ``max_attempts``, ``ordered``, ...) apply when the group is created, as do
        ``start``/``timestamp_ms`` (where a new group starts). Without ``mode``, a member of an
        existing stream-mode group joins it and keeps its membership alive; ``mode="queue"`` for
        a stream-mode group is refused.
        ``filter``: a CEL expression evaluated by the server on each record (variables ``key``,
        ``headers``, ``op``, ``partition``, ``timestamp_ms`` and ``value``, the JSON document when
        the value is JSON); only matching records are delivered. An invalid expression raises
        :class:`InvalidArgument` on the first ``next()``. A filter with ``group`` raises
        :class:`InvalidArgument` at once (the broker refuses filtered group subscriptions).
        """
        if group is not None:
            if partition is not None:
                raise invalid_argument("a group member reads the partitions the group gives it: drop partition")
            if filter:
                raise invalid_argument(GROUP_FILTER_REFUSED)
            return self._subscribe_group(topic, group, start=start, timestamp_ms=timestamp_ms,
                                         stop_at_end=stop_at_end, max_batch=max_batch, **group_options)
        if group_options:
            raise invalid_argument(f"unknown option(s) {sorted(group_options)} (group options need group=...)")
        wire.check_read_options(max_batch, partition)
        return Subscription(
            self._router,
            topic,
            partition=partition,
            position=wire.position(start, timestamp_ms),
            stop_at_end=stop_at_end,
            max_batch=max_batch,
            partition_count=lambda: self.describe_topic(topic).partition_count,
            filter=filter or "",
            latest_ends=lambda: self._latest_ends(topic),
        )

    def subscribe_batches(
        self,
        topic: str,
        *,
        partition: int | None = None,
        start: str | int | bytes = "earliest",
        timestamp_ms: int | None = None,
        stop_at_end: bool = False,
        max_batch: int = 0,
    ) -> BatchSubscription:
        """Records of ``topic`` as :class:`Batch` values, for a reader that wants throughput: what
        :meth:`subscribe` delivers (same positions, ``stop_at_end``, resumption after a node failure
        and events), but one object per batch of consecutive records of one partition instead of a
        :class:`Record` each. ``batch.values[i]`` is the value at ``batch.first_offset + i``;
        ``batch.next_position`` resumes after the batch. ``max_batch`` bounds the records per batch
        (0: the server's default); the server also bounds a batch's bytes."""
        wire.check_read_options(max_batch, partition)
        return BatchSubscription(
            self._router,
            topic,
            partition=partition,
            position=wire.position(start, timestamp_ms),
            stop_at_end=stop_at_end,
            max_batch=max_batch,
            partition_count=lambda: self.describe_topic(topic).partition_count,
            latest_ends=lambda: self._latest_ends(topic),
        )

    def _latest_ends(self, topic: str) -> dict[int, int] | None:
        """Each partition's end offset as the leader has it (``wire.latest_ends``)."""
        request = admin_pb2.DescribeTopicRequest(name=topic)
        info = self._router.call(lambda addr, t: self._router.admin(addr).DescribeTopic(request, timeout=t),
                                 write=True, what=f"describe topic {topic}")
        return wire.latest_ends(wire.topic_info(info))

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

    def verify_replicas(self) -> ReplicaVerification:
        """Every member's digest of apply outcomes at the lowest index all reachable members have
        applied (docs/operations.md, "Verifying replicas"). FAILED_PRECONDITION from no node: a node
        that keeps no digest yet (the cluster's command format is below 2) is named with the reason."""
        response = self._router.call(
            lambda addr, t: self._router.admin(addr).VerifyReplicas(admin_pb2.VerifyReplicasRequest(), timeout=t),
            write=False,
            what="replica verification",
        )
        return wire.replica_verification(response)

    def add_node(self, node_id: str, raft_address: str, grpc_address: str) -> None:
        """Make a running node a member (start it first with the current members as its peers); it
        catches up from the leader. Idempotent for the same addresses; ALREADY_EXISTS (``MemberExists``)
        if the id or Raft address belongs to another member. One change at a time."""
        self._router.admin_call(add_node_call(node_id, raft_address, grpc_address))
        self._router.learn(grpc_address, is_leader=False)

    def remove_node(self, node_id: str) -> None:
        """Take a member out of the cluster (the leader hands leadership over first); stop its process
        afterwards. A node that is not a member: NOT_FOUND (``MemberNotFound``, the message names it)."""
        self._router.admin_call(remove_node_call(node_id))
