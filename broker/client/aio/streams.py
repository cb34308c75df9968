"""Async iterators over the ``Subscribe`` stream: :class:`AsyncSubscription` (a log read) and
:class:`AsyncConsumer` (a consumer-group member).

Contracts are the sync SDK's (:mod:`broker.client.subscription`, :mod:`broker.client.consumer`):
a subscription reads each partition in its own stream that resumes after a node failure from the
last delivered record's position token, so it never skips nor repeats a record it delivered; a
consumer receives leased messages (at-least-once) and follows the leader by itself. Each partition
stream is an asyncio task feeding one queue: no thread per stream. Only what the broker sent is
yielded, and the broker sends only committed records, so ``on_event`` sees committed data only.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Generic, TypeVar, cast

import grpc

from broker.client import checks, wire
from broker.client.acks import settled_each
from broker.client.aio.acks import AckCoalescer
from broker.client.aio.routing import AsyncRouter, metadata
from broker.client.consumer import DEFAULT_IN_FLIGHT, GROUP_FILTER_REFUSED, commit_request, committed
from broker.client.errors import (
    BrokerError,
    GroupNotFound,
    Unavailable,
    error_from_rpc,
    invalid_argument,
    leader_hint,
    rpc_details,
)
from broker.client.groups import group_config
from broker.client.models import Batch, Event, Record
from broker.client.routing import Backoff, is_retryable
from broker.v1 import admin_pb2, broker_pb2, common_pb2

#: ``on_event(kind, item)``: kind is "record", "batch" (of ``subscribe_batches``), "event"
#: (loss/reset), "message" (a leased group record) or "rebalance" (a stream-mode member's
#: partitions changed; item is the tuple of them).
Observer = Callable[[str, object], None]
_ESTABLISHED_S = 5.0
_END = object()


async def _follow(router: AsyncRouter, open_call: Callable[[str], Any], on_response: Callable[[Any], None],
                  what: str, closed: asyncio.Event, start: str | None = None) -> None:
    """Run a server stream on the leader (or any node), reopening it after retryable failures until it
    ends; gives up with ``Unavailable`` after ``retry_deadline_s`` of failures without a response, and
    raises ``BrokerError`` (CANCELLED) "the client was closed" when the client closes under it."""
    policy = router.policy
    backoff = Backoff(policy.backoff_initial_s, policy.backoff_max_s)
    address = start or await router.read_address()
    failing_since: float | None = None
    tls = router.tls_watch()
    while not closed.is_set():
        call = open_call(address)
        started = time.monotonic()
        try:
            async for response in call:
                failing_since = None
                backoff.reset()
                on_response(response)
            return
        except asyncio.CancelledError:
            # grpc.aio ends a call its closing channel cancelled with CancelledError, as if this task
            # had been cancelled: the reader would wait forever for an end nobody queues.
            if router.closed and not _cancelled(asyncio.current_task()):
                raise client_closed(what) from None
            raise
        except grpc.RpcError as err:
            if closed.is_set():
                return
            if not is_retryable(err):
                raise error_from_rpc(err) from None
            if await router.disagree_on_tls(tls, address, err):
                raise tls.error(what, False) from None
            now = time.monotonic()
            if failing_since is None or now - started >= _ESTABLISHED_S:
                failing_since = now
            if now - failing_since >= policy.retry_deadline_s:
                raise Unavailable("UNAVAILABLE", f"{what}: no node served the stream within "
                                  f"{policy.retry_deadline_s:g}s; last error: {rpc_details(err)}") from None
            router.forget_leader(address)
            address = leader_hint(err) or await router.discover_leader() or router.next_address(address)
            await asyncio.sleep(backoff.next_delay_s())
        finally:
            call.cancel()


def client_closed(what: str) -> BrokerError:
    """What a stream's reader gets when the client closes under it (the sync client's code)."""
    return BrokerError("CANCELLED", f"{what}: the client was closed")


def _cancelled(task: asyncio.Task[Any] | None) -> bool:
    """Whether ``task`` itself was asked to stop (``task.cancel()``), not one of its calls."""
    return task is not None and task.cancelling() > 0


class _Merged:
    """Tasks feeding one queue; the iterator ends when all have ended, or raises the first error.
    A task that ends in any way but :meth:`close` queues its end or its error, so the iterator
    never waits for a task that is gone."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1000)
        self.closed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._running = 0

    def start(self, make: Callable[[], Any]) -> None:
        self._running += 1

        async def run() -> None:
            try:
                await make()
                item: object = _END
            except asyncio.CancelledError:
                if self.closed.is_set() or _cancelled(asyncio.current_task()):
                    raise  # close(): nobody waits for this task's items
                item = BrokerError("CANCELLED", "the stream was cancelled (was the client closed?)")
            except Exception as err:  # noqa: BLE001 - raised to the iterating caller
                item = err
            await self.queue.put(item)
        self._tasks.append(asyncio.get_running_loop().create_task(run()))

    async def next(self) -> object:
        while self._running:
            item = await self.queue.get()
            if item is _END:
                self._running -= 1
                continue
            if isinstance(item, Exception):
                await self.close()
                raise item
            return item
        raise StopAsyncIteration

    async def close(self) -> None:
        self.closed.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._running = 0


T = TypeVar("T", Record | Event, Batch | Event)


class _AsyncResuming(AsyncIterator[T], Generic[T]):
    """One stream per partition, each reopened after a failure right after what it delivered;
    subclasses turn responses into items (:meth:`_items_of`)."""

    _compact = False  # ask for CompactBatch responses

    def __init__(self, router: AsyncRouter, topic: str, partitions: Callable[[], Any], *,
                 position: common_pb2.Position, stop_at_end: bool, max_batch: int, filter: str,
                 on_event: Observer | None, latest_ends: Callable[[], Any] | None = None) -> None:
        """``latest_ends``: for a ``position`` of "latest", a coroutine function giving each
        partition's end offset as the leader has it (None: an ephemeral topic); the partitions then
        start there, so a stream reopened before it delivered anything does not resolve "latest"
        again (that skipped, with nothing said, what was committed while the stream was down)."""
        self._router, self._topic, self._partitions = router, topic, partitions
        self._latest_ends = latest_ends
        self._position, self._stop_at_end, self._max_batch, self._filter = position, stop_at_end, max_batch, filter
        self._on_event = on_event
        self.positions: dict[int, bytes] = {}
        self.starts: dict[int, common_pb2.Position] = {}  # per partition, instead of the common start
        self._merged: _Merged | None = None

    def __aiter__(self) -> _AsyncResuming[T]:
        return self

    _kind = "record"  # what on_event calls a delivered item that is not an event

    async def __anext__(self) -> T:
        if self._merged is None:
            partitions = await self._partitions()
            if self._latest_ends is not None and wire.is_latest(self._position):
                ends = await self._latest_ends()
                for partition in partitions if ends is not None else ():
                    if partition in ends and partition not in self.positions:
                        self.starts.setdefault(partition, common_pb2.Position(offset=ends[partition]))
            self._merged = _Merged()
            for partition in partitions:
                self._merged.start(functools.partial(self._run, partition))
        item = cast(T, await self._merged.next())
        if self._on_event is not None:
            self._on_event("event" if isinstance(item, Event) else self._kind, item)
        return item

    async def __aenter__(self) -> _AsyncResuming[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._merged is not None:
            await self._merged.close()

    def _request(self, partition: int) -> broker_pb2.SubscribeRequest:
        token = self.positions.get(partition)
        position = common_pb2.Position(token=token) if token else self.starts.get(partition, self._position)
        return broker_pb2.SubscribeRequest(topic=self._topic, partition=partition, stop_at_end=self._stop_at_end,
                                           max_batch=self._max_batch, filter=self._filter, compact=self._compact,
                                           **{"from": position})

    @abstractmethod
    def _items_of(self, partition: int, response: broker_pb2.SubscribeResponse) -> list[object]:
        """The items one response carries (and the resume position it moves)."""

    async def _run(self, partition: int) -> None:
        assert self._merged is not None
        merged = self._merged
        pending: list[object] = []

        def on_response(response: broker_pb2.SubscribeResponse) -> None:
            pending.extend(self._items_of(partition, response))

        def open_call(address: str) -> Any:
            call = self._router.broker(address).Subscribe(self._request(partition), metadata=metadata())
            return _Draining(call, pending, merged.queue)

        await _follow(self._router, open_call, on_response, f"subscribe {self._topic}", merged.closed)


class AsyncSubscription(_AsyncResuming[Record | Event]):
    """``async for item in client.subscribe(topic)``: :class:`Record` and :class:`Event` items.

    Per partition in order; partitions interleave. ``position`` tokens of delivered records are
    kept per partition (:attr:`positions`) and a reopened stream starts right after them. Before
    iterating, :attr:`positions` (tokens) and :attr:`starts` (positions) may be set per partition to
    start partitions at different places (a saved cursor)."""

    async def __aenter__(self) -> AsyncSubscription:
        return self

    def _items_of(self, partition: int, response: broker_pb2.SubscribeResponse) -> list[object]:
        items: list[object] = []
        if response.HasField("batch"):
            for msg in response.batch.records:
                record = wire.record(msg)
                if record.position:
                    self.positions[partition] = record.position
                items.append(record)
        elif response.HasField("event"):
            items.append(wire.event(response.event))
        return items


class AsyncBatchSubscription(_AsyncResuming[Batch | Event]):
    """``async for item in client.subscribe_batches(topic)``: :class:`Batch` and :class:`Event`
    items (see :meth:`broker.client.Client.subscribe_batches`); :attr:`positions` holds each
    partition's ``next_position``."""

    _compact = True
    _kind = "batch"

    async def __aenter__(self) -> AsyncBatchSubscription:
        return self

    def _items_of(self, partition: int, response: broker_pb2.SubscribeResponse) -> list[object]:
        kind = response.WhichOneof("body")
        if kind == "event":
            return [wire.event(response.event)]
        if kind == "compact":
            batch = wire.compact_batch(response.compact)
        elif kind == "batch" and response.batch.records:
            batch = wire.records_batch(response.batch)
        else:
            return []
        if batch.next_position:
            self.positions[partition] = batch.next_position
        return [batch]


class _Draining:
    """Wraps a stream call so each response's items are queued before the next is read (the queue
    bounds memory: a slow reader slows the stream, which the server then paces)."""

    def __init__(self, call: Any, pending: list[object], queue: asyncio.Queue[object]) -> None:
        self._call, self._pending, self._queue = call, pending, queue

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for response in self._call:
            yield response
            while self._pending:
                await self._queue.put(self._pending.pop(0))

    def cancel(self) -> None:
        self._call.cancel()


class AsyncMessage:
    """A leased record of a group, with the verbs that settle it (each replicated)."""

    def __init__(self, consumer: AsyncConsumer, msg: common_pb2.Record) -> None:
        self._consumer = consumer
        self.record: Record = wire.record(msg)
        self.delivery_attempt: int = msg.delivery_attempt
        self.settled = False

    topic = property(lambda self: self.record.topic)
    partition = property(lambda self: self.record.partition)
    offset = property(lambda self: self.record.offset)
    key = property(lambda self: self.record.key)
    value = property(lambda self: self.record.value)
    headers = property(lambda self: self.record.headers)
    position = property(lambda self: self.record.position)

    async def ack(self) -> bool:
        """Processed: settled for good (returns once replicated); whether this call settled the
        record, as the sync :meth:`broker.client.Message.ack`."""
        return await self._consumer.ack([self]) > 0

    async def nack(self, delay_ms: int | None = None) -> None:
        await self._consumer.nack([self], delay_ms)

    async def extend(self, ms: int | None = None) -> int:
        return (await self._consumer.extend([self], ms))[0]

    async def discard(self, reason: str = "") -> None:
        await self._consumer.discard([self], reason)


class AsyncConsumer(AsyncIterator["AsyncMessage | Event"]):
    """A consumer-group member: ``async with client.subscribe(topic, group=g) as c: async for m in c``
    (or ``client.consumer(topic, g)``). Iteration yields :class:`AsyncMessage` and :class:`Event`
    items; the client's ``on_event(kind, item)`` observes them and does not take the events away
    (unlike the sync ``Consumer``'s ``on_event(event)``, which receives the events instead)."""

    def __init__(self, router: AsyncRouter, topic: str, group: str, *, mode: str | None = None,
                 start: str | int | bytes = "earliest", timestamp_ms: int | None = None, stop_at_end: bool = False,
                 max_in_flight: int = DEFAULT_IN_FLIGHT, max_batch: int = 0, member_id: str | None = None,
                 on_event: Observer | None = None, filter: str | None = None, **config: Any) -> None:
        if filter:
            raise invalid_argument(GROUP_FILTER_REFUSED)
        checks.check_group(group)
        checks.check_int(max_in_flight, "max_in_flight", 1, checks.UINT32_MAX)
        checks.check_int(max_batch, "max_batch", 0, checks.UINT32_MAX)
        self._router, self.topic, self.group = router, topic, group
        self.member_id = member_id or uuid.uuid4().hex[:16]
        self._config = group_config(mode, start=start if start != "earliest" else None, timestamp_ms=timestamp_ms,
                                    **config)
        # None until asked: without a mode, the group's own (stream-mode members must join and beat)
        self._stream_mode: bool | None = None if mode is None else mode == "stream"
        self._request = broker_pb2.SubscribeRequest(
            topic=topic, group=group, group_config=self._config, member_id=self.member_id,
            max_in_flight=max_in_flight, max_batch=max_batch, stop_at_end=stop_at_end)
        self._on_event = on_event
        self._merged: _Merged | None = None
        self._beats: asyncio.Task[None] | None = None
        self._acks = AckCoalescer(self._send_acks)
        # by record: a record delivered again (its lease ran out) replaces its earlier delivery's message
        self._unsettled: dict[tuple[int, int], AsyncMessage] = {}
        self.assigned: tuple[int, ...] = ()

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> AsyncMessage | Event:
        if self._merged is None:
            if await self.stream_mode():
                await self._join()
            self._merged = _Merged()
            self._merged.start(self._run)
        item = await self._merged.next()
        assert isinstance(item, AsyncMessage | Event)
        if isinstance(item, AsyncMessage):
            self._unsettled[(item.partition, item.offset)] = item
        if self._on_event is not None:
            self._on_event("message" if isinstance(item, AsyncMessage) else "event", item)
        return item

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self) -> None:
        assert self._merged is not None
        merged = self._merged
        pending: list[object] = []

        def on_response(response: broker_pb2.SubscribeResponse) -> None:
            if response.HasField("event"):
                pending.append(wire.event(response.event))
            for msg in response.batch.records:
                pending.append(AsyncMessage(self, msg))

        def open_call(address: str) -> Any:
            return _Draining(self._router.broker(address).Subscribe(self._request, metadata=metadata()), pending,
                             merged.queue)

        start = self._router.leader or await self._router.discover_leader()
        try:
            await _follow(self._router, open_call, on_response, f"group {self.group} of {self.topic}",
                          merged.closed, start)
        finally:  # the stream is over (its end, an error): no more beats; the session then ends by itself
            if self._beats is not None:
                self._beats.cancel()

    async def stream_mode(self) -> bool:
        """Whether this member is a stream-mode member: as ``mode`` said, or without one, as the group
        is (a group that does not exist yet is created in queue mode by the subscription)."""
        if self._stream_mode is None:
            request = admin_pb2.DescribeGroupRequest(topic=self.topic, group=self.group)
            try:
                info = await self._router.call(
                    lambda a, t: self._router.admin(a).DescribeGroup(request, timeout=t, metadata=metadata()),
                    write=False, what=f"describe group {self.group}")
                self._stream_mode = info.config.mode == common_pb2.DELIVERY_MODE_STREAM
            except GroupNotFound:
                self._stream_mode = False
        return self._stream_mode

    async def _join(self) -> None:
        request = broker_pb2.JoinGroupRequest(topic=self.topic, group=self.group, member_id=self.member_id,
                                              group_config=self._config)
        response = await self._router.call(
            lambda a, t: self._router.broker(a).JoinGroup(request, timeout=t, metadata=metadata()),
            write=True, what=f"join group {self.group}")
        self._assign(tuple(response.partitions))
        interval_s = max(response.session_timeout_ms / 3000, 0.05)
        self._beats = asyncio.get_running_loop().create_task(self._beat(interval_s))

    def _assign(self, partitions: tuple[int, ...]) -> None:
        if partitions != self.assigned:
            self.assigned = partitions
            if self._on_event is not None:
                self._on_event("rebalance", partitions)

    async def _beat(self, interval_s: float) -> None:
        request = broker_pb2.HeartbeatRequest(topic=self.topic, group=self.group, member_id=self.member_id)
        while not self._router.closed:  # a closed client's stream ends with an error: stop beating too
            await asyncio.sleep(interval_s)
            with contextlib.suppress(BrokerError):  # keep beating through failovers; the stream reports errors
                response = await self._router.call(
                    lambda a, t: self._router.broker(a).Heartbeat(request, timeout=t, metadata=metadata()),
                    write=True, what="heartbeat")
                self._assign(tuple(response.partitions))

    # -- settling --------------------------------------------------------------------------------
    async def _settle(self, messages: Sequence[AsyncMessage], what: str,
                      send: Callable[[list[bytes], str, float], Any]) -> None:
        positions = [m.position for m in messages if not m.settled]
        if positions:
            await self._router.call(lambda a, t: send(positions, a, t), write=True, what=f"{what} in {self.group}")
            for m in messages:
                m.settled = True
                self._forget(m)

    def _forget(self, message: AsyncMessage) -> None:
        """Drop a settled message from :meth:`unsettled` (not a later delivery of its record)."""
        key = (message.partition, message.offset)
        if self._unsettled.get(key) is message:
            del self._unsettled[key]

    async def ack(self, messages: Sequence[AsyncMessage]) -> int:
        """Settle ``messages`` for good; returns once replicated, with how many of them this call
        settled (as the sync :meth:`broker.client.Consumer.ack`). Concurrent acks of this consumer
        share requests (:mod:`broker.client.aio.acks`)."""
        pending = [m for m in messages if not m.settled]
        settled = await self._acks.ack([m.position for m in pending])
        for m in pending:
            m.settled = True
            self._forget(m)
        return sum(settled)

    async def _send_acks(self, positions: list[bytes]) -> list[bool]:
        request = broker_pb2.AckRequest(topic=self.topic, group=self.group, positions=positions)
        response = await self._router.call(
            lambda a, t: self._router.broker(a).Ack(request, timeout=t, metadata=metadata()),
            write=True, what=f"ack in {self.group}")
        return settled_each(response.settled, response.not_settled, len(positions))

    async def nack(self, messages: Sequence[AsyncMessage], delay_ms: int | None = None) -> None:
        if delay_ms is not None:
            checks.check_int(delay_ms, "delay_ms", 0, checks.NACK_DELAY_MAX_MS)
        await self._settle(messages, "nack", lambda p, a, t: self._router.broker(a).Nack(
            broker_pb2.NackRequest(topic=self.topic, group=self.group, positions=p, delay_ms=delay_ms or 0),
            timeout=t, metadata=metadata()))

    async def discard(self, messages: Sequence[AsyncMessage], reason: str = "") -> None:
        await self._settle(messages, "discard", lambda p, a, t: self._router.broker(a).Discard(
            broker_pb2.DiscardRequest(topic=self.topic, group=self.group, positions=p, reason=reason),
            timeout=t, metadata=metadata()))

    async def extend(self, messages: Sequence[AsyncMessage], ms: int | None = None) -> list[int]:
        if ms is not None:
            checks.check_int(ms, "ms (the lease's length)", 0, checks.EXTEND_MAX_MS)
        request = broker_pb2.ExtendRequest(topic=self.topic, group=self.group,
                                           positions=[m.position for m in messages], extend_ms=ms or 0)
        response = await self._router.call(
            lambda a, t: self._router.broker(a).Extend(request, timeout=t, metadata=metadata()),
            write=True, what=f"extend in {self.group}")
        return list(response.deadlines_ms)

    async def commit(self, partition: int, offset: int) -> None:
        """Stream mode: settle everything below ``offset`` in ``partition`` (never moves back). A
        queue-mode group raises :class:`~broker.client.errors.FailedPrecondition`: settle its
        messages with ``ack``/``nack``/``discard`` (:meth:`broker.client.Consumer.commit`)."""
        request = commit_request(self.topic, self.group, partition, offset)
        await self._router.call(lambda a, t: self._router.broker(a).Commit(request, timeout=t, metadata=metadata()),
                                write=True, what=f"commit in {self.group}")
        for message in committed(self._unsettled, partition, offset):
            message.settled = True

    def unsettled(self) -> list[AsyncMessage]:
        """The messages this member received and has not settled yet (a record delivered again
        counts once, as its latest delivery); ``close`` forgets them (it gives them back)."""
        return list(self._unsettled.values())

    async def stop(self) -> None:
        """Stop the stream but keep this member's leases: they run until settled or until their
        visibility timeout (what a claim wants; :meth:`close` gives them back)."""
        if self._beats is not None:
            self._beats.cancel()
        if self._merged is not None:
            await self._merged.close()

    async def close(self) -> None:
        """Stop the stream and leave the group (unsettled leases are redelivered at once)."""
        await self.stop()
        self._unsettled.clear()
        with contextlib.suppress(BrokerError):  # best effort: leases also run out by themselves
            leave = broker_pb2.LeaveGroupRequest(topic=self.topic, group=self.group, member_id=self.member_id)
            await self._router.call(lambda a, t: self._router.broker(a).LeaveGroup(leave, timeout=t,
                                                                                    metadata=metadata()),
                                    write=True, what="leave")
