"""The asyncio client: ``async with AsyncClient(["127.0.0.1:7001"]) as c: await c.publish(...)``.

The same surface and guarantees as the sync :class:`broker.client.Client`, on ``grpc.aio`` (no
thread per call): every call goes to the leader, found by following ``x-leader`` redirects or by
asking the nodes; failovers are retried within ``retry_deadline_s``. Publishing is exactly-once
in effect, as with the sync client: a batch without caller keys is one range of one of the
client's producer sessions (:mod:`broker.client.sessions`; each in-flight call holds its own
session), records with caller keys are sent with per-record keys; every retry resends the same
request, so a retry of an attempt applied unseen stores nothing new and answers ``duplicate=True``
with the original places. Back-pressure: ``max_in_flight_batches`` publish calls run at once per
client; more wait their turn. Concurrent ``publish`` calls to one topic share requests, one request
in flight per topic (:mod:`broker.client.aio.coalescing`; ``coalesce_publishes=False`` turns it off),
and those requests travel on one ``PublishStream`` per topic, cheaper for the node than a call each
(:mod:`broker.client.aio.publish_streams`; ``stream_publishes=False``: unary calls).

Retention changes, prune and clear (:mod:`.log_admin`), routes (:mod:`.routes`), bounded reads
(:mod:`.ranges`), typed topics (:mod:`.typed`) and ``client.groups`` (:mod:`.groups`) are the sync
client's calls, built and read by the same functions (:mod:`broker.client.calls`) and awaited.

:meth:`AsyncClient.close` ends every subscription and consumer being iterated: the iteration raises
``BrokerError`` (CANCELLED) "the client was closed", as with the sync client. Arguments are checked
(InvalidArgument naming the argument) before anything is sent or leased.

``on_event(kind, item)`` observes what the broker committed: "published" (a list of
:class:`PublishResult` after a publish returned), and, from subscriptions and consumers, "record",
"batch" (``subscribe_batches``), "message", "event" (loss/reset) and "rebalance" (see :mod:`broker.client.aio.streams`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, overload

import grpc

from broker.client import checks, wire
from broker.client.acks import settled_each
from broker.client.aio.coalescing import PublishCoalescer
from broker.client.aio.groups import AsyncGroups
from broker.client.aio.handlers import AsyncHandler, HandlerRun
from broker.client.aio.log_admin import AsyncLogAdminMixin
from broker.client.aio.publish_streams import PublishStreams
from broker.client.aio.ranges import AsyncRangesMixin
from broker.client.aio.routes import AsyncRoutesMixin
from broker.client.aio.routing import AsyncRouter, metadata
from broker.client.aio.streams import AsyncBatchSubscription, AsyncConsumer, AsyncMessage, AsyncSubscription, Observer
from broker.client.aio.typed import AsyncTypedTopicsMixin
from broker.client.client import RecordLike
from broker.client.consumer import GROUP_FILTER_REFUSED
from broker.client.errors import (
    BrokerError,
    DuplicateMessageError,
    FailedPrecondition,
    GroupNotFound,
    TopicExists,
    TopicNotFound,
    invalid_argument,
)
from broker.client.groups import GroupLag, lag_call
from broker.client.handlers import log_event
from broker.client.membership import add_node_call, remove_node_call
from broker.client.models import (
    ClusterStatus,
    Event,
    OutgoingRecord,
    PublishResult,
    PublishResults,
    ReplicaVerification,
    Retention,
    TopicInfo,
    Watermark,
)
from broker.client.routing import RetryPolicy
from broker.client.security import ClientSecurity
from broker.client.sessions import SessionPool
from broker.v1 import admin_pb2, broker_pb2, common_pb2

# a claim leases records of a queue-mode group; a stream-mode group gives partitions to members instead
CLAIM_IS_QUEUE_MODE = ("claim is for queue-mode groups (a stream-mode group gives its partitions to "
                       "members: subscribe as one)")


class Claimed(list[AsyncMessage]):
    """The messages :meth:`AsyncClient.claim` leased, and in ``events`` the group's events its
    stream was sent before them, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []


class AsyncClient(AsyncLogAdminMixin, AsyncRangesMixin, AsyncRoutesMixin, AsyncTypedTopicsMixin):
    """A connection to a raftbroker cluster for asyncio code; ``async with`` it or ``await close()``."""

    def __init__(self, bootstrap: Sequence[str] | str, *, timeout_s: float = 10.0, retry_deadline_s: float = 30.0,
                 no_quorum_grace_s: float = 1.0, max_in_flight_batches: int = 64, coalesce_publishes: bool = True,
                 stream_publishes: bool = True, on_event: Observer | None = None,
                 security: ClientSecurity | None = None) -> None:
        """``coalesce_publishes``: concurrent :meth:`publish` calls to one topic go together, one request
        in flight per topic (:mod:`broker.client.aio.coalescing`); False sends each as its own call.
        ``stream_publishes``: those coalesced requests travel on a ``PublishStream`` per topic
        (:mod:`broker.client.aio.publish_streams`); False: one unary ``Publish`` call each."""
        if bootstrap is None:  # as the sync client says it (its config file is not read here)
            raise ValueError("give bootstrap addresses")
        addresses = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
        if max_in_flight_batches < 1:
            raise ValueError("max_in_flight_batches must be at least 1")
        self._router = AsyncRouter(addresses, RetryPolicy(timeout_s=timeout_s, retry_deadline_s=retry_deadline_s,
                                                          no_quorum_grace_s=no_quorum_grace_s), security)
        self._in_flight = asyncio.Semaphore(max_in_flight_batches)
        self._sessions = SessionPool()
        self._on_event = on_event
        self._streams = PublishStreams(self._router) if stream_publishes else None
        self._coalescer = PublishCoalescer(self._publish_coalesced) if coalesce_publishes else None
        self._closing = False

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Wait for the answers of the publishes already made, then close every channel. Publishes
        made from now on are refused (CANCELLED): other tasks publishing on kept the queue from ever
        emptying, and close never returned."""
        self._closing = True
        if self._coalescer is not None:
            await self._coalescer.drain()
        if self._streams is not None:
            await self._streams.close()
        await self._router.close()

    @property
    def leader(self) -> str | None:
        return self._router.leader

    @property
    def known_addresses(self) -> list[str]:
        return self._router.known_addresses

    async def _admin(self, method: str, request: Any, *, write: bool, what: str) -> Any:
        return await self._router.call(
            lambda a, t: getattr(self._router.admin(a), method)(request, timeout=t, metadata=metadata()),
            write=write, what=what)

    async def _broker(self, method: str, request: Any, *, write: bool, what: str) -> Any:
        return await self._router.call(
            lambda a, t: getattr(self._router.broker(a), method)(request, timeout=t, metadata=metadata()),
            write=write, what=what)

    # -- topics ---------------------------------------------------------------------------------
    async def create_topic(self, name: str, partitions: int = 1, *,
                           retention: Mapping[str, int | None] | Retention | None = None,
                           durability: str | None = None, full_policy: str | None = None,
                           dedup_window_ms: int | None = None, schema: Mapping[str, Any] | str | None = None,
                           dedup_fields: Sequence[str] | None = None, exist_ok: bool = False) -> TopicInfo:
        """Create a topic (the contract of :meth:`Client.create_topic`)."""
        request = wire.create_topic_request(name, partitions, retention, durability, full_policy, dedup_window_ms,
                                            schema, dedup_fields)
        try:
            info = await self._admin("CreateTopic", request, write=True, what=f"create topic {name}")
        except TopicExists as err:
            if err.after_unknown_outcome:
                return await self.describe_topic(name)
            if not exist_ok:
                raise
            existing = await self.describe_topic(name)
            differences = wire.config_differences(request.config, existing)
            if differences:
                raise wire.exists_differently(err, differences) from None
            return existing
        return wire.topic_info(info)

    async def describe_topic(self, name: str) -> TopicInfo:
        request = admin_pb2.DescribeTopicRequest(name=name)
        return wire.topic_info(await self._admin("DescribeTopic", request, write=False, what=f"describe topic {name}"))

    async def list_topics(self) -> list[TopicInfo]:
        response = await self._admin("ListTopics", admin_pb2.ListTopicsRequest(), write=False, what="list topics")
        return sorted((wire.topic_info(t) for t in response.topics), key=lambda t: t.name)

    async def drop_topic(self, name: str) -> None:
        try:
            await self._admin("DropTopic", admin_pb2.DropTopicRequest(name=name), write=True, what=f"drop topic {name}")
        except TopicNotFound as err:
            if not err.after_unknown_outcome:
                raise

    # -- publishing -----------------------------------------------------------------------------
    async def publish(self, topic: str, value: bytes | str, *, key: bytes | str | None = None,
                      partition: int | None = None, headers: Mapping[str, str] | None = None,
                      idempotency_key: str | None = None, dedup_id: str | None = None,
                      msg_id: int | None = None) -> PublishResult:
        """Publish one record (the contract of :meth:`Client.publish`: ``idempotency_key``, or your
        own producer session ``dedup_id`` + ``msg_id``). Calls made while this topic's request is in
        flight go together in the next request (see :mod:`broker.client.aio.coalescing`); each caller
        gets its own result or error."""
        record = OutgoingRecord(value=value, key=key, partition=partition, headers=checks.headers_of(headers),
                                idempotency_key=idempotency_key, msg_id=msg_id)
        self._check_open(f"publish to {topic}")
        if self._coalescer is None or idempotency_key is not None or dedup_id is not None or msg_id is not None:
            return (await self.publish_batch(topic, [record], dedup_id=dedup_id))[0]
        return await self._coalescer.publish(topic, record)

    async def publish_batch(self, topic: str, records: Sequence[RecordLike], *, dedup_id: str | None = None,
                            first_msg_id: int | None = None) -> PublishResults:
        """Publish records all-or-nothing; one result per record, in order (see :meth:`Client.publish_batch`)."""
        self._check_open(f"publish to {topic}")
        return await self._publish_batch(topic, records, dedup_id, first_msg_id, None)

    def _check_open(self, what: str) -> None:
        if self._closing:
            raise BrokerError("CANCELLED", f"{what}: the client is closed")

    async def _publish_coalesced(self, topic: str, records: Sequence[RecordLike]) -> PublishResults:
        """One request of the coalescer: on the topic's ``PublishStream`` (unless ``stream_publishes=False``)."""
        return await self._publish_batch(topic, records, None, None, self._streams)

    async def _publish_batch(self, topic: str, records: Sequence[RecordLike], dedup_id: str | None,
                             first_msg_id: int | None, streams: PublishStreams | None) -> PublishResults:
        """``streams``: send on them (the coalescer's requests), else as a unary call."""
        call = wire.publish_request(topic, records, dedup_id, first_msg_id)
        if call is None:
            return PublishResults(0, list)
        async with self._in_flight:
            if not call.in_session:
                response = await self._send(topic, call.data(), streams)
            else:
                response = await self._send_in_session(call, streams)
        results = wire.publish_results(response, call.count, call.keys)
        if self._on_event is not None:
            self._on_event("published", results)
        return results

    async def _send(self, topic: str, data: bytes, streams: PublishStreams | None) -> broker_pb2.PublishResponse:
        try:
            if streams is not None:
                response: broker_pb2.PublishResponse = await self._router.call(
                    lambda a, t: streams.publish(a, topic, data, t, metadata()), write=True, what=f"publish to {topic}")
            else:
                response = await self._router.call(
                    lambda a, t: self._router.publisher(a).Publish(data, timeout=t, metadata=metadata()),
                    write=True, what=f"publish to {topic}")
        except TopicExists as err:  # ALREADY_EXISTS from a publish: a repeat of dedup fields
            raise DuplicateMessageError(err.code, err.message,
                                        after_unknown_outcome=err.after_unknown_outcome) from None
        return response

    async def _send_in_session(self, call: wire.PublishCall,
                               streams: PublishStreams | None) -> broker_pb2.PublishResponse:
        """The asyncio twin of :func:`broker.client.sessions.publish_in_session`: each in-flight call
        holds its own session, so concurrent tasks never interleave one session's numbers."""
        topic, count = call.topic, call.count
        for attempt in range(2):
            session = self._sessions.take(topic)
            try:
                response = await self._send(topic, call.data(session.dedup_id, session.next_msg_id), streams)
            except BaseException as err:
                if self._sessions.failed(topic, session, err) and attempt == 0:
                    continue
                raise
            self._sessions.stored(topic, session, count)
            return response
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def get_watermarks(self, topic: str) -> list[Watermark]:
        """As :meth:`Client.get_watermarks`: every watermark, asked page by page."""
        marks: list[Watermark] = []
        while True:
            request = admin_pb2.GetWatermarksRequest(topic=topic, limit=wire.WATERMARKS_PAGE,
                                                     after_dedup_id=marks[-1].dedup_id if marks else "")
            response = await self._admin("GetWatermarks", request, write=False, what=f"get watermarks of {topic}")
            marks += [wire.watermark(m) for m in response.watermarks]
            if not response.more or not response.watermarks:
                return marks

    async def reset_watermark(self, topic: str, dedup_id: str) -> bool:
        """As :meth:`Client.reset_watermark`: whether there was a watermark to forget."""
        request = admin_pb2.ResetWatermarkRequest(topic=topic, dedup_id=wire.check_id(dedup_id, "dedup_id"))
        response = await self._admin("ResetWatermark", request, write=True,
                                     what=f"reset watermark {dedup_id} of {topic}")
        return bool(response.existed)

    # -- consuming ------------------------------------------------------------------------------
    @overload
    def subscribe(self, topic: str, *, group: None = None, **options: Any) -> AsyncSubscription: ...

    @overload
    def subscribe(self, topic: str, *, group: str, **options: Any) -> AsyncConsumer: ...

    def subscribe(self, topic: str, *, group: str | None = None, partition: int | None = None,
                  start: str | int | bytes = "earliest", timestamp_ms: int | None = None, stop_at_end: bool = False,
                  max_batch: int = 0, filter: str | None = None,
                  **group_options: Any) -> AsyncSubscription | AsyncConsumer:
        """Records and events of ``topic`` from ``start`` (see :meth:`Client.subscribe`); ``async for`` it.
        With ``group``: an :class:`AsyncConsumer`, a member of that consumer group (as :meth:`consumer`;
        ``mode`` and the group options apply when the group is created)."""
        if group is not None:
            if partition is not None:
                raise invalid_argument("a group member reads the partitions the group gives it: drop partition")
            if filter:
                raise invalid_argument(GROUP_FILTER_REFUSED)
            return self.consumer(topic, group, start=start, timestamp_ms=timestamp_ms, stop_at_end=stop_at_end,
                                 max_batch=max_batch, **group_options)
        if group_options:
            raise invalid_argument(f"unknown option(s) {sorted(group_options)} (group options need group=...)")
        wire.check_read_options(max_batch, partition)
        return AsyncSubscription(self._router, topic, self._partitions(topic, partition),
                                 position=wire.position(start, timestamp_ms), stop_at_end=stop_at_end,
                                 max_batch=max_batch, filter=filter or "", on_event=self._on_event,
                                 latest_ends=functools.partial(self._latest_ends, topic))

    def subscribe_batches(self, topic: str, *, partition: int | None = None, start: str | int | bytes = "earliest",
                          timestamp_ms: int | None = None, stop_at_end: bool = False,
                          max_batch: int = 0) -> AsyncBatchSubscription:
        """Records of ``topic`` as :class:`Batch` values (see :meth:`Client.subscribe_batches`);
        ``async for`` it. ``on_event`` sees each batch as "batch"."""
        wire.check_read_options(max_batch, partition)
        return AsyncBatchSubscription(self._router, topic, self._partitions(topic, partition),
                                      position=wire.position(start, timestamp_ms), stop_at_end=stop_at_end,
                                      max_batch=max_batch, filter="", on_event=self._on_event,
                                      latest_ends=functools.partial(self._latest_ends, topic))

    async def _latest_ends(self, topic: str) -> dict[int, int] | None:
        """Each partition's end offset as the leader has it (``wire.latest_ends``)."""
        request = admin_pb2.DescribeTopicRequest(name=topic)
        return wire.latest_ends(wire.topic_info(await self._admin("DescribeTopic", request, write=True,
                                                                  what=f"describe topic {topic}")))

    def _partitions(self, topic: str, partition: int | None) -> Callable[[], Awaitable[list[int]]]:
        """What a subscription reads: ``partition``, or every partition of ``topic`` when it starts."""

        async def partitions() -> list[int]:
            if partition is not None:
                return [partition]
            return list(range((await self.describe_topic(topic)).partition_count))

        return partitions

    def consumer(self, topic: str, group: str, **options: Any) -> AsyncConsumer:
        """A member of consumer group ``group`` (the options of :class:`AsyncConsumer`)."""
        options.setdefault("on_event", self._on_event)
        return AsyncConsumer(self._router, topic, group, **options)

    async def claim(self, topic: str, group: str, *, max_records: int = 1, visibility_ms: int | None = None,
                    **group_options: Any) -> Claimed:
        """Lease up to ``max_records`` deliverable records of a queue group and return at once (fewer,
        or none, when fewer are deliverable). With ``visibility_ms`` the leases end that long from now;
        else after the group's visibility timeout. Settle them with ``ack``/``nack``/``extend``.
        The group's events sent with them (``SKIP_FORWARD`` for records pruned before anyone received
        them, ``RESET``, ``BADMSG``) are in ``.events``: settling a message that came after one tells
        the group that it was received (SPEC §3.3), so read them first."""
        # Every argument is checked before anything is leased: a claim refused after it leased would
        # strand its leases until they ran out.
        checks.check_int(max_records, "max_records", 1, 1000)
        if visibility_ms is not None:
            checks.check_int(visibility_ms, "visibility_ms", 1, checks.EXTEND_MAX_MS)
        fixed = sorted({"stop_at_end", "max_in_flight", "max_batch"} & set(group_options))
        if fixed:
            raise invalid_argument(f"claim sets {', '.join(fixed)} itself (from max_records): drop them")
        if group_options.get("mode") == "stream":
            raise invalid_argument(CLAIM_IS_QUEUE_MODE)
        group_options.setdefault("mode", "queue")  # a stream-mode group is refused just below: no lookup per claim
        consumer = AsyncConsumer(self._router, topic, group, stop_at_end=True, max_in_flight=max_records,
                                 max_batch=max_records, **group_options)  # checks the rest; sends nothing yet
        await self._refuse_stream_group(topic, group)
        claimed = Claimed()
        try:
            async for item in consumer:
                if isinstance(item, AsyncMessage):
                    claimed.append(item)
                    if len(claimed) >= max_records:
                        break
                else:
                    claimed.events.append(item)
        finally:
            await consumer.stop()  # not close(): leaving the group would give the leases back
        if claimed and visibility_ms is not None:
            await consumer.extend(claimed, visibility_ms)
        return claimed

    async def _refuse_stream_group(self, topic: str, group: str) -> None:
        """A claim of a stream-mode group would make its caller a member that owns partitions, heard
        of never again until its session ran out (the real members starved meanwhile): refused."""
        request = admin_pb2.DescribeGroupRequest(topic=topic, group=group)
        try:
            info = await self._admin("DescribeGroup", request, write=False, what=f"describe group {group}")
        except GroupNotFound:  # the claim creates it, in queue mode
            return
        if info.config.mode == common_pb2.DELIVERY_MODE_STREAM:
            raise FailedPrecondition(grpc.StatusCode.FAILED_PRECONDITION.name,
                                     f"group {group!r} of {topic!r} is a stream-mode group: {CLAIM_IS_QUEUE_MODE}")

    async def run(self, topic: str, *, group: str, handler: AsyncHandler, ack: str = "auto", concurrency: int = 1,
                  batch_size: int = 1, mode: str | None = None, limit: int | None = None,
                  on_event: Callable[[Event], None] | None = None, **options: Any) -> int:
        """Feed the group's messages to ``await handler(message)``, ``concurrency`` at a time, until the
        stream ends or ``limit`` were handled; returns how many. The arguments of :meth:`Client.run`,
        with the same meanings: ``ack="auto"``: a handler that returns acks, one that raises nacks;
        ``ack="manual"``: the handler settles (``await message.ack()``, ...) and a message it leaves
        unsettled is nacked. ``batch_size``: as many leases per handler slot are asked for (the acks
        of finished handlers share requests whatever it is: :mod:`broker.client.aio.acks`).
        ``on_event(event)``: the group's events (``skip_forward``: records pruned before anyone
        received them, ``reset``, ``badmsg``); default: logged as warnings. ``options``: as for
        :meth:`consumer`. A settle that fails is logged as a warning, as the sync client does (its
        record comes back when its lease runs out). In stream mode the messages of one partition are
        handled one after another, in order. The sync ``stop`` event has no twin: cancel the task
        that awaits run(). If run() is cancelled (or the stream fails), the handlers still running
        are cancelled and awaited before it ends; their records are delivered again once their
        leases run out."""
        if "stop" in options:
            raise invalid_argument("AsyncClient.run takes no stop event: cancel the task awaiting run() instead")
        if ack not in ("auto", "manual"):
            raise invalid_argument(f"ack must be 'auto' or 'manual', got {ack!r}")
        for name, value in (("concurrency", concurrency), ("batch_size", batch_size)):
            checks.check_int(value, name, 1, checks.UINT32_MAX)
        if limit is not None:
            checks.check_int(limit, "limit", 1, checks.INT64_MAX)
        options.setdefault("max_in_flight", max(2 * concurrency * batch_size, concurrency + 1))
        consumer = self.consumer(topic, group, mode=mode, **options)  # checks the group and options first
        try:
            in_order = await consumer.stream_mode()
        except BaseException:
            await consumer.close()
            raise
        return await HandlerRun(handler, manual=ack == "manual", concurrency=concurrency, in_order=in_order,
                                on_event=on_event or log_event).run(consumer, limit)

    @property
    def groups(self) -> AsyncGroups:
        """Group administration (:class:`~broker.client.aio.groups.AsyncGroups`: the sync
        ``Client.groups``, awaited): create, describe, lag, seek/replay, pause/resume, dead letters."""
        return AsyncGroups(self._router)

    async def group_lag(self, topic: str, group: str) -> GroupLag:
        """``await client.groups.lag(topic, group)`` (kept for the HTTP gateway and older callers)."""
        return await self._router.admin_call(lag_call(topic, group))

    async def settle(self, verb: str, topic: str, group: str, positions: Sequence[bytes], *,
                     delay_ms: int | None = None, extend_ms: int | None = None) -> list[int]:
        """Ack, nack (after ``delay_ms``) or extend (by ``extend_ms``) leases by their position tokens.
        Per position, ack returns 1 if this call settled its record, else 0 (settled before, a repeat
        earlier in the call, a position of an older incarnation of the topic); extend returns the new
        deadlines (0: the lease was lost); nack returns nothing. For callers holding only positions."""
        positions = list(positions)
        if verb == "ack":
            acked = await self._broker("Ack", broker_pb2.AckRequest(topic=topic, group=group, positions=positions),
                                       write=True, what=f"ack in {group}")
            return [int(settled) for settled in settled_each(acked.settled, acked.not_settled, len(positions))]
        elif verb == "nack":
            if delay_ms is not None:
                checks.check_int(delay_ms, "delay_ms", 0, checks.NACK_DELAY_MAX_MS)
            await self._broker("Nack", broker_pb2.NackRequest(topic=topic, group=group, positions=positions,
                                                              delay_ms=delay_ms or 0), write=True,
                               what=f"nack in {group}")
        elif verb == "extend":
            if extend_ms is not None:
                checks.check_int(extend_ms, "extend_ms", 0, checks.EXTEND_MAX_MS)
            response = await self._broker("Extend", broker_pb2.ExtendRequest(
                topic=topic, group=group, positions=positions, extend_ms=extend_ms or 0), write=True,
                what=f"extend in {group}")
            return list(response.deadlines_ms)
        else:
            raise invalid_argument(f"verb must be ack, nack or extend, got {verb!r}")
        return []

    # -- cluster --------------------------------------------------------------------------------
    async def verify_replicas(self) -> ReplicaVerification:
        """Every member's digest of apply outcomes compared at one index (``Client.verify_replicas``)."""
        response = await self._admin("VerifyReplicas", admin_pb2.VerifyReplicasRequest(), write=False,
                                     what="replica verification")
        return wire.replica_verification(response)

    async def cluster_status(self) -> ClusterStatus:
        response = await self._admin("ClusterStatus", admin_pb2.ClusterStatusRequest(), write=False,
                                     what="cluster status")
        status = wire.cluster_status(response)
        for node in status.nodes:
            if node.grpc_address:
                self._router.learn(node.grpc_address, is_leader=node.id == status.leader_id and node.reachable)
        return status

    async def add_node(self, node_id: str, raft_address: str, grpc_address: str) -> None:
        """Make a running node a member (the contract of :meth:`broker.client.Client.add_node`:
        idempotent for the same addresses; ``MemberExists`` if the id or Raft address is another
        member's; a node that does not answer is refused, FAILED_PRECONDITION)."""
        await self._router.admin_call(add_node_call(node_id, raft_address, grpc_address))
        self._router.learn(grpc_address, is_leader=False)

    async def remove_node(self, node_id: str) -> None:
        """Take a member out of the cluster (the leader hands leadership over first); stop its process
        afterwards. A node that is not a member: ``MemberNotFound``."""
        await self._router.admin_call(remove_node_call(node_id))
