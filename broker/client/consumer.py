"""A consumer-group member (SPEC §3.2, §6): ``client.subscribe(topic, group=..., mode=...)``.

Contract: iterating a :class:`Consumer` yields :class:`Message` (a leased record: settle it with
``ack()``, ``nack(delay_ms)``, ``extend()`` or ``discard(reason)``) and, unless ``on_event`` is
given, :class:`~broker.client.Event` (loss or reset reports, each with the positions before and
after). Delivery is at-least-once: a record not settled within the group's visibility timeout,
and every record in flight when the leader fails, is delivered again; nothing settled is. The
stream follows the leader across failovers by itself; settle calls are retried on the new
leader (settling is idempotent). ``close()`` gives unsettled records back for immediate
redelivery and, in stream mode, leaves the group. Sync iteration, or ``async for``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar

import grpc

from broker.client import checks, wire
from broker.client.acks import ThreadAckCoalescer, settled_each
from broker.client.errors import (
    GroupNotFound,
    error_from_rpc,
    gave_up,
    invalid_argument,
    leader_hint,
    rpc_details,
)
from broker.client.groups import group_config
from broker.client.models import Event, Record
from broker.client.routing import Backoff, RetryPolicy, Router, TlsWatch, is_retryable
from broker.v1 import admin_pb2, broker_pb2, common_pb2

DEFAULT_IN_FLIGHT = 100
_DONE = object()
GROUP_FILTER_REFUSED = (
    "a group subscription cannot take a filter (the broker refuses it: records it skipped would have to be "
    "settled for the whole group, which it does not do yet); filter in the consumer and ack what it skips, "
    "or copy the matching records into their own topic with a filtered route and consume that")


def commit_request(topic: str, group: str, partition: int, offset: int) -> broker_pb2.CommitRequest:
    """A stream-mode member's ``Commit`` (both SDKs'): the numbers checked before anything is sent."""
    checks.check_int(partition, "partition", 0, checks.UINT32_MAX)
    checks.check_int(offset, "offset", 0, checks.UINT64_MAX)
    return broker_pb2.CommitRequest(topic=topic, group=group, partition=partition, offset=offset)


M = TypeVar("M")


def committed(unsettled: dict[tuple[int, int], M], partition: int, offset: int) -> list[M]:
    """Remove from ``unsettled`` (by (partition, offset)) and return the messages a commit of
    ``partition`` below ``offset`` settled (both SDKs')."""
    done = [key for key in unsettled if key[0] == partition and key[1] < offset]
    return [unsettled.pop(key) for key in done]


class Message:
    """A record delivered to a group member, with the verbs that settle it (each replicated)."""

    def __init__(self, consumer: Consumer, msg: common_pb2.Record) -> None:
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
    timestamp_ms = property(lambda self: self.record.timestamp_ms)
    position = property(lambda self: self.record.position)

    def __repr__(self) -> str:
        return (f"Message({self.topic}/{self.partition}@{self.offset}, attempt {self.delivery_attempt}, "
                f"{len(self.value)} bytes)")

    def ack(self) -> bool:
        """Processed: settled for good (returns once replicated). Returns True when this call
        settled the record, False when it was settled already: acked before, or its lease ran
        out and it was redelivered (maybe to another member, which then settled it), so this
        processing may have been a repeat (at-least-once). After a retry of a call whose first
        attempt was lost, a record that attempt settled counts as settled already (False)."""
        return self._consumer.ack([self]) > 0

    def nack(self, delay_ms: int | None = None) -> None:
        """Failed: delivered again after ``delay_ms`` (None: the group's backoff); after the group's
        ``max_attempts`` failures it goes to the dead letters."""
        self._consumer.nack([self], delay_ms)

    def extend(self, ms: int | None = None) -> int:
        """Still working on it: the lease now ends ``ms`` (None: the visibility timeout) from now.
        Returns the new deadline (ms since the epoch), 0 if the lease was already lost."""
        return self._consumer.extend([self], ms)[0]

    def discard(self, reason: str = "") -> None:
        """Poison: straight to the dead letters, no more attempts."""
        self._consumer.discard([self], reason)

    async def ack_async(self) -> bool:
        return await asyncio.to_thread(self.ack)

    async def nack_async(self, delay_ms: int | None = None) -> None:
        await asyncio.to_thread(self.nack, delay_ms)

    async def extend_async(self, ms: int | None = None) -> int:
        return await asyncio.to_thread(self.extend, ms)

    async def discard_async(self, reason: str = "") -> None:
        await asyncio.to_thread(self.discard, reason)


Item = Message | Event


class Consumer:
    """One member of a consumer group; iterate it (sync or async), ``close()`` it when done."""

    def __init__(self, router: Router, topic: str, group: str, *, mode: str | None = None,
                 start: str | int | bytes = "earliest", timestamp_ms: int | None = None, stop_at_end: bool = False,
                 max_in_flight: int = DEFAULT_IN_FLIGHT, max_batch: int = 0, member_id: str | None = None,
                 on_event: Callable[[Event], None] | None = None, filter: str | None = None,
                 **config: Any) -> None:
        if filter:
            raise invalid_argument(GROUP_FILTER_REFUSED)
        checks.check_group(group)
        checks.check_int(max_in_flight, "max_in_flight", 1, checks.UINT32_MAX)
        checks.check_int(max_batch, "max_batch", 0, checks.UINT32_MAX)
        self._router = router
        self.topic, self.group = topic, group
        self.member_id = member_id or f"{uuid.uuid4().hex[:16]}"
        self._config = group_config(mode, start=start if start != "earliest" else None, timestamp_ms=timestamp_ms,
                                    **config)
        # None until asked: without a mode, the group's own (stream-mode members must join and beat)
        self._stream_mode: bool | None = None if mode is None else mode == "stream"
        self._request = broker_pb2.SubscribeRequest(
            topic=topic, group=group, group_config=self._config, member_id=self.member_id,
            max_in_flight=max_in_flight, max_batch=max_batch, stop_at_end=stop_at_end)
        self._on_event = on_event
        # by record: a record delivered again (its lease ran out) replaces its earlier delivery's message
        self._unsettled: dict[tuple[int, int], Message] = {}
        self._lock = threading.Lock()
        self._acks = ThreadAckCoalescer(self._send_acks)
        self._call: grpc.Call | None = None
        self._closed = threading.Event()
        self._stream_over = threading.Event()  # the stream ended (its end, an error, close): beats stop
        self._heartbeats: threading.Thread | None = None
        self.assigned: tuple[int, ...] = ()  # stream mode: this member's partitions at the last heartbeat
        self._items = self._run()

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> Item:
        return next(self._items)

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Item:
        item = await asyncio.to_thread(next, self._items, _DONE)
        if item is _DONE:
            raise StopAsyncIteration
        assert isinstance(item, Message | Event)
        return item

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    def _run(self) -> Generator[Item, None, None]:
        policy = self._router.policy
        backoff = Backoff(policy.backoff_initial_s, policy.backoff_max_s)
        address = self._router.leader or self._router.discover_leader() or self._router.next_address(None)
        failing_since: float | None = None
        tls = self._router.tls_watch()
        if self.stream_mode:
            self._join()
        try:
            yield from self._follow(address, policy, backoff, failing_since, tls)
        finally:  # no more beats once the stream is over: the session then ends by itself
            self._stream_over.set()

    def _follow(self, address: str, policy: RetryPolicy, backoff: Backoff, failing_since: float | None,
                tls: TlsWatch) -> Generator[Item, None, None]:
        while not self._closed.is_set():
            call = self._open(address)
            try:
                for response in call:
                    failing_since = None
                    backoff.reset()
                    yield from self._items_of(response)
                return
            except grpc.RpcError as err:
                if self._closed.is_set():
                    return
                if not is_retryable(err):
                    raise error_from_rpc(err) from None
                if self._router.disagree_on_tls(tls, address, err):
                    raise tls.error(f"group {self.group} of {self.topic}", False) from None
                now = time.monotonic()
                failing_since = failing_since if failing_since is not None else now
                if now - failing_since >= policy.retry_deadline_s:
                    raise gave_up(f"group {self.group} of {self.topic}: no leader served the stream within "
                                  f"{policy.retry_deadline_s:g}s; last error: {rpc_details(err)}", err) from None
                self._router.forget_leader(address)
                address = leader_hint(err) or self._router.discover_leader() or self._router.next_address(address)
                time.sleep(backoff.next_delay_s())
            finally:
                call.cancel()

    def _open(self, address: str) -> grpc.Call:
        call = self._router.broker(address).Subscribe(self._request)
        with self._lock:
            self._call = call
        if self._closed.is_set():
            call.cancel()
        return call

    def _items_of(self, response: broker_pb2.SubscribeResponse) -> Generator[Item, None, None]:
        if response.HasField("event"):
            event = wire.event(response.event)
            if self._on_event is not None:
                self._on_event(event)
            else:
                yield event
            return
        for msg in response.batch.records:
            message = Message(self, msg)
            with self._lock:
                self._unsettled[(msg.partition, msg.offset)] = message
            yield message

    # -- stream-mode membership ------------------------------------------------------------------
    @property
    def stream_mode(self) -> bool:
        """Whether this member is a stream-mode member: as ``mode`` said, or without one, as the group
        is (a group that does not exist yet is created in queue mode by the subscription)."""
        if self._stream_mode is None:
            request = admin_pb2.DescribeGroupRequest(topic=self.topic, group=self.group)
            try:
                info = self._router.call(lambda a, t: self._router.admin(a).DescribeGroup(request, timeout=t),
                                         write=False, what=f"describe group {self.group}")
                self._stream_mode = info.config.mode == common_pb2.DELIVERY_MODE_STREAM
            except GroupNotFound:
                self._stream_mode = False
        return self._stream_mode

    def _join(self) -> None:
        request = broker_pb2.JoinGroupRequest(topic=self.topic, group=self.group, member_id=self.member_id,
                                              group_config=self._config)
        response = self._router.call(lambda a, t: self._router.broker(a).JoinGroup(request, timeout=t),
                                     write=True, what=f"join group {self.group}")
        self.assigned = tuple(response.partitions)
        interval_s = max(response.session_timeout_ms / 3000, 0.05)
        self._heartbeats = threading.Thread(target=self._beat, args=(interval_s,), daemon=True,
                                            name=f"raftbroker-heartbeat-{self.group}")
        self._heartbeats.start()

    def _beat(self, interval_s: float) -> None:
        request = broker_pb2.HeartbeatRequest(topic=self.topic, group=self.group, member_id=self.member_id)
        while not self._stream_over.wait(interval_s) and not self._closed.is_set() and not self._router.closed:
            try:
                response = self._router.call(lambda a, t: self._router.broker(a).Heartbeat(request, timeout=t),
                                             write=True, what="heartbeat")
                self.assigned = tuple(response.partitions)
            except Exception:  # noqa: BLE001 - keep beating through failovers; the stream reports errors
                continue

    # -- settling --------------------------------------------------------------------------------
    def _settle(self, messages: Sequence[Message], what: str, send: Callable[[list[bytes], str, float], object]
                ) -> object:
        positions = [m.position for m in messages if not m.settled]
        if not positions:
            return None
        result = self._router.call(lambda a, t: send(positions, a, t), write=True, what=f"{what} in {self.group}")
        with self._lock:
            for m in messages:
                m.settled = True
                self._forget(m)
        return result

    def _forget(self, message: Message) -> None:
        """Drop a settled message from :meth:`unsettled` (not a later delivery of its record). Under the lock."""
        key = (message.partition, message.offset)
        if self._unsettled.get(key) is message:
            del self._unsettled[key]

    def ack(self, messages: Sequence[Message]) -> int:
        """Settle ``messages`` in one replicated command; returns how many of them this call
        settled (the others were settled already: see :meth:`Message.ack`; messages this consumer
        had settled before are not sent and not counted). Acks of this consumer made from several
        threads at once share requests (:mod:`broker.client.acks`); each still returns once its own
        messages were settled, with its own count."""
        pending = [m for m in messages if not m.settled]
        settled = self._acks.ack([m.position for m in pending])
        with self._lock:
            for m in pending:
                m.settled = True
                self._forget(m)
        return sum(settled)

    def _send_acks(self, positions: list[bytes]) -> list[bool]:
        request = broker_pb2.AckRequest(topic=self.topic, group=self.group, positions=positions)
        response = self._router.call(lambda a, t: self._router.broker(a).Ack(request, timeout=t), write=True,
                                     what=f"ack in {self.group}")
        return settled_each(response.settled, response.not_settled, len(positions))

    def nack(self, messages: Sequence[Message], delay_ms: int | None = None) -> None:
        if delay_ms is not None:
            checks.check_int(delay_ms, "delay_ms", 0, checks.NACK_DELAY_MAX_MS)

        def send(positions: list[bytes], a: str, t: float) -> object:
            request = broker_pb2.NackRequest(topic=self.topic, group=self.group, positions=positions,
                                             delay_ms=delay_ms or 0)
            return self._router.broker(a).Nack(request, timeout=t)
        self._settle(messages, "nack", send)

    def discard(self, messages: Sequence[Message], reason: str = "") -> None:
        def send(positions: list[bytes], a: str, t: float) -> object:
            request = broker_pb2.DiscardRequest(topic=self.topic, group=self.group, positions=positions, reason=reason)
            return self._router.broker(a).Discard(request, timeout=t)
        self._settle(messages, "discard", send)

    def extend(self, messages: Sequence[Message], ms: int | None = None) -> list[int]:
        if ms is not None:
            checks.check_int(ms, "ms (the lease's length)", 0, checks.EXTEND_MAX_MS)
        request = broker_pb2.ExtendRequest(topic=self.topic, group=self.group, positions=[m.position for m in messages],
                                           extend_ms=ms or 0)
        response = self._router.call(lambda a, t: self._router.broker(a).Extend(request, timeout=t), write=True,
                                     what=f"extend in {self.group}")
        return list(response.deadlines_ms)

    def commit(self, partition: int, offset: int) -> None:
        """Stream mode: settle everything below ``offset`` in ``partition`` (never moves back). A
        queue-mode group raises :class:`~broker.client.errors.FailedPrecondition`: settle its
        messages with ``ack``/``nack``/``discard``."""
        request = commit_request(self.topic, self.group, partition, offset)
        self._router.call(lambda a, t: self._router.broker(a).Commit(request, timeout=t), write=True,
                          what=f"commit in {self.group}")
        with self._lock:
            for message in committed(self._unsettled, partition, offset):
                message.settled = True

    def unsettled(self) -> list[Message]:
        """The messages this member received and has not settled yet (a record delivered again
        counts once, as its latest delivery); ``close`` forgets them (it gives them back)."""
        with self._lock:
            return list(self._unsettled.values())

    def close(self) -> None:
        """Stop the stream and leave the group: every record leased to this member and not settled
        (also those still in transit) is redelivered at once, without counting an attempt; in
        stream mode its partitions move now. Safe to call twice and from any thread."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._stream_over.set()
        with self._lock:
            call = self._call
            self._unsettled.clear()
        if call is not None:
            call.cancel()
        with contextlib.suppress(Exception):  # best effort: leases also run out by themselves
            leave = broker_pb2.LeaveGroupRequest(topic=self.topic, group=self.group, member_id=self.member_id)
            self._router.call(lambda a, t: self._router.broker(a).LeaveGroup(leave, timeout=t), write=True,
                              what="leave")
        with contextlib.suppress(ValueError):  # being iterated by another thread, which stops on the cancel
            self._items.close()
