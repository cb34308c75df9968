"""A stateless subscription (SPEC §3.1) that survives node failures.

Contract: records of each partition are delivered in offset order, each at least once and,
across a failover, never skipped: after a retryable failure the subscription re-subscribes on
the leader (or any node, if none is known) from the position token of the last record it
delivered for that partition. A subscription over all partitions of a multi-partition topic
that fails after delivering records continues as one stream per partition (merged by threads)
because one ``Position`` cannot carry a token per partition. Events are delivered as they come
(a resumed stream may repeat an event). ``stop_at_end`` is re-evaluated on each re-subscribe.
A subscription from "latest" reads each partition's end offset from the leader as it starts and
reopens a partition that delivered nothing yet from there: "latest" resolved again at the reopen
skipped, silently, what was committed while the stream was down.

:class:`BatchSubscription` is the same machinery delivering :class:`Batch` values (compact
responses: no object per record) and resuming from each batch's ``next_position``.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

import grpc

from broker.client import wire
from broker.client.errors import error_from_rpc, gave_up, leader_hint, rpc_details
from broker.client.models import Batch, Event, Record
from broker.client.routing import Backoff, Router, is_retryable
from broker.v1 import broker_pb2, common_pb2

Item = Record | Event
BatchItem = Batch | Event
T = TypeVar("T", Item, BatchItem)
_ESTABLISHED_S = 1.0  # a stream that lived this long before failing had been working
_QUEUE_MAX = 1024


class _Interrupted(Exception):
    """A retryable failure of the all-partitions stream after records were delivered."""


@dataclass
class _Failed:
    error: BaseException


_DONE = object()


class _Resuming(Iterator[T], Generic[T]):
    """The streams of one subscription, resumed after failures; subclasses turn responses into items."""

    _compact = False  # ask for CompactBatch responses

    def __init__(
        self,
        router: Router,
        topic: str,
        *,
        partition: int | None,
        position: common_pb2.Position,
        stop_at_end: bool,
        max_batch: int,
        partition_count: Callable[[], int],
        filter: str = "",
        latest_ends: Callable[[], dict[int, int] | None] | None = None,
    ) -> None:
        """``latest_ends``: for a ``position`` of "latest", each partition's end offset, read from
        the leader before the first stream opens (None: an ephemeral topic)."""
        self._router = router
        self._topic = topic
        self._partition = partition
        self._position = position
        self._stop_at_end = stop_at_end
        self._max_batch = max_batch
        self._partition_count = partition_count
        self._filter = filter  # CEL, evaluated by the server
        self._tokens: dict[int, bytes] = {}  # partition -> position of the last delivered record
        self._latest_ends = latest_ends
        # "latest" as offsets, read as the subscription starts: a stream reopened before it delivered
        # anything of a partition starts there, never at a "latest" resolved again (that skipped, with
        # nothing said, what was committed while the stream was down)
        self._ends: dict[int, int] | None = None
        self._calls: set[grpc.Call] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._items: Generator[T, None, None] = self._run()

    def __iter__(self) -> _Resuming[T]:
        return self

    def __next__(self) -> T:
        return next(self._items)

    def __enter__(self) -> _Resuming[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the open streams; iteration then ends. Safe to call from any thread, twice."""
        with self._lock:
            self._closed = True
            calls = list(self._calls)
        for call in calls:
            call.cancel()
        # ValueError: being iterated by another thread, which stops on the cancellation.
        with contextlib.suppress(ValueError):
            self._items.close()

    # -- plan -----------------------------------------------------------------------------------

    def _run(self) -> Generator[T, None, None]:
        if self._latest_ends is not None and wire.is_latest(self._position):
            self._ends = self._latest_ends()
        if self._partition is not None:
            yield from self._stream(self._partition, resumable=True)
            return
        try:
            yield from self._stream(None, resumable=False)
            return
        except _Interrupted:
            pass
        count = self._partition_count()
        if count == 1:
            yield from self._stream(0, resumable=True)
        else:
            yield from self._merge([self._stream(p, resumable=True) for p in range(count)])

    def _merge(self, streams: list[Iterator[T]]) -> Iterator[T]:
        """Items of every stream as they arrive, through a bounded queue fed by one thread each."""
        items: queue.Queue[object] = queue.Queue(maxsize=_QUEUE_MAX)

        def pump(stream: Iterator[T]) -> None:
            try:
                for item in stream:
                    while not self._closed:
                        try:
                            items.put(item, timeout=0.2)
                            break
                        except queue.Full:
                            continue
                    if self._closed:
                        return
            except BaseException as err:  # handed to the consumer thread
                items.put(_Failed(err))
            finally:
                items.put(_DONE)

        threads = [threading.Thread(target=pump, args=(s,), daemon=True) for s in streams]
        for thread in threads:
            thread.start()
        remaining = len(threads)
        try:
            while remaining:
                item = items.get()
                if item is _DONE:
                    remaining -= 1
                elif isinstance(item, _Failed):
                    raise item.error
                else:
                    yield cast(T, item)
        finally:
            self.close()

    # -- one stream -----------------------------------------------------------------------------

    def _request(self, partition: int | None) -> broker_pb2.SubscribeRequest:
        token = self._tokens.get(partition) if partition is not None else None
        position = common_pb2.Position(token=token) if token else self._position
        if not token and partition is not None and self._ends is not None and partition in self._ends:
            position = common_pb2.Position(offset=self._ends[partition])
        request = broker_pb2.SubscribeRequest(
            topic=self._topic,
            stop_at_end=self._stop_at_end,
            max_batch=self._max_batch,
            filter=self._filter,
            compact=self._compact,
            **{"from": position},  # "from" is a Python keyword
        )
        if partition is not None:
            request.partition = partition
        return request

    def _stream(self, partition: int | None, *, resumable: bool) -> Iterator[T]:
        """Subscribe calls one after another from the last delivered position until one ends.

        Not ``resumable`` (all partitions in one stream): a retryable failure after a record was
        delivered raises :class:`_Interrupted`; before any, the stream is simply opened again.
        """
        policy = self._router.policy
        backoff = Backoff(policy.backoff_initial_s, policy.backoff_max_s)
        address = self._router.read_address()
        failing_since: float | None = None
        tls = self._router.tls_watch()
        while not self._closed:
            call = self._open(address, self._request(partition))
            started = time.monotonic()
            try:
                for response in call:
                    failing_since = None
                    backoff.reset()
                    yield from self._items_of(response)
                return
            except grpc.RpcError as err:
                if self._closed:
                    return
                if not is_retryable(err):
                    raise error_from_rpc(err) from None
                if not resumable and (self._tokens or self._ends is not None):
                    raise _Interrupted() from None  # on per partition, from where it delivered or began
                if self._router.disagree_on_tls(tls, address, err):
                    raise tls.error(f"subscribe {self._topic}", False) from None
                now = time.monotonic()
                if failing_since is None or now - started >= _ESTABLISHED_S:
                    failing_since = now
                if now - failing_since >= policy.retry_deadline_s:
                    raise gave_up(f"subscribe {self._topic}: no node served the stream within "
                                  f"{policy.retry_deadline_s:g}s; last error: {rpc_details(err)}", err) from None
                self._router.forget_leader(address)
                hint = leader_hint(err)
                address = hint or self._router.discover_leader() or self._router.next_address(address)
                time.sleep(backoff.next_delay_s())
            finally:
                self._release(call)

    @abstractmethod
    def _items_of(self, response: broker_pb2.SubscribeResponse) -> Iterator[T]:
        """The items one response carries (and the resume position it moves)."""

    def _open(self, address: str, request: broker_pb2.SubscribeRequest) -> grpc.Call:
        call = self._router.broker(address).Subscribe(request)
        with self._lock:
            self._calls.add(call)
            if self._closed:  # close() ran before the call was registered
                call.cancel()
        return call

    def _release(self, call: grpc.Call) -> None:
        call.cancel()  # a no-op on a finished call; stops the server stream on early exit
        with self._lock:
            self._calls.discard(call)


class Subscription(_Resuming[Item]):
    """Iterator of :class:`Record` and :class:`Event`; ``close()`` (any thread) ends it."""

    def __enter__(self) -> Subscription:
        return self

    def _items_of(self, response: broker_pb2.SubscribeResponse) -> Iterator[Item]:
        if response.HasField("batch"):
            for msg in response.batch.records:
                record = wire.record(msg)
                if record.position:
                    self._tokens[record.partition] = record.position
                yield record
        elif response.HasField("event"):
            yield wire.event(response.event)


class BatchSubscription(_Resuming[BatchItem]):
    """Iterator of :class:`Batch` and :class:`Event`; ``close()`` (any thread) ends it."""

    _compact = True

    def __enter__(self) -> BatchSubscription:
        return self

    def _items_of(self, response: broker_pb2.SubscribeResponse) -> Iterator[BatchItem]:
        kind = response.WhichOneof("body")
        if kind == "compact":
            batch = wire.compact_batch(response.compact)
        elif kind == "batch" and response.batch.records:
            batch = wire.records_batch(response.batch)
        else:
            if kind == "event":
                yield wire.event(response.event)
            return
        if batch.next_position:
            self._tokens[batch.partition] = batch.next_position
        yield batch
