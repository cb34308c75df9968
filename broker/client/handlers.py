"""Handler-style consumption (SPEC §6): ``client.run(topic, group=..., handler=fn, ...)``, and the
group methods of :class:`~broker.client.Client` (:class:`GroupsMixin`).

``run`` calls ``handler(message)`` on ``concurrency`` worker threads. ``ack="auto"``: a handler
that returns acks its message, one that raises nacks it (the group's backoff decides when it
comes back). ``ack="manual"``: the handler settles (``ack``/``nack``/``extend``/``discard``); if it
returns (or raises) without settling, the message is nacked, so nothing is stranded. Settlements
are sent in batches by one thread, one replicated command each: every outcome queued when a batch
is sent goes with it (up to :data:`SETTLE_BATCH_MAX`, or ``batch_size`` if larger), so the acks of
workers that finished while the previous batch was in flight share the next; with ``batch_size`` > 1
the thread also waits up to 5 ms for that many. In stream mode the records of one partition always
go to the same worker, one after another (per-partition order).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from broker.client import checks
from broker.client.consumer import Consumer, Message
from broker.client.errors import BrokerError, invalid_argument
from broker.client.groups import Groups
from broker.client.models import Event
from broker.client.routing import Router

log = logging.getLogger(__name__)


def log_event(event: Event) -> None:
    """What a handler-driven consumer does with a group's event nobody asked for: a logged warning
    (``skip_forward``: records pruned before anyone received them; ``reset``; ``badmsg``), never
    nothing (SPEC §3.3: no silent loss)."""
    log.warning("%s: %s", event.topic, event)


Handler = Callable[[Message], object]
_STOP = object()
_SETTLE_LINGER_S = 0.005
SETTLE_BATCH_MAX = 1000  # outcomes per settle call at most (the leader takes up to 10,000 positions)


class _Settler:
    """Collects outcomes and settles them in batches on its own thread."""

    def __init__(self, consumer: Consumer, batch_size: int) -> None:
        self._consumer = consumer
        self._batch_size = batch_size
        self.queue: queue.Queue[object] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="raftbroker-settle", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        done = False
        while not done:
            batch: list[tuple[str, Message]] = []
            item = self.queue.get()
            while True:
                if item is _STOP:
                    done = True
                    break
                assert isinstance(item, tuple)
                batch.append(item)
                if len(batch) >= max(self._batch_size, SETTLE_BATCH_MAX):  # a larger batch_size is the caller's
                    break
                try:  # what is queued already goes along; up to batch_size, wait a little for more
                    item = self.queue.get_nowait()
                except queue.Empty:
                    if len(batch) >= self._batch_size:
                        break
                    try:
                        item = self.queue.get(timeout=_SETTLE_LINGER_S)
                    except queue.Empty:
                        break
            self._flush(batch)

    def _flush(self, batch: list[tuple[str, Message]]) -> None:
        acks = [m for verb, m in batch if verb == "ack" and not m.settled]
        nacks = [m for verb, m in batch if verb == "nack" and not m.settled]
        try:
            if acks:
                self._consumer.ack(acks)
            if nacks:
                self._consumer.nack(nacks)
        except BrokerError as err:  # the leases run out and the records come back: at-least-once
            log.warning("settling %d records failed: %s", len(acks) + len(nacks), err)

    def stop(self) -> None:
        self.queue.put(_STOP)
        self._thread.join()


def run_handler(consumer: Consumer, handler: Handler, *, ack: str = "auto", concurrency: int = 1,
                batch_size: int = 1, limit: int | None = None, stop: threading.Event | None = None) -> int:
    """Feed ``consumer``'s messages to ``handler`` until the consumer ends, ``limit`` messages were
    handled or ``stop`` is set; returns how many were handled. Closes the consumer. A stream-mode
    member's messages of one partition go to one worker, in order."""
    if ack not in ("auto", "manual"):
        raise invalid_argument(f"ack must be 'auto' or 'manual', got {ack!r}")
    for name, value in (("concurrency", concurrency), ("batch_size", batch_size)):  # as the asyncio run checks
        checks.check_int(value, name, 1, checks.UINT32_MAX)
    if limit is not None:
        checks.check_int(limit, "limit", 1, checks.INT64_MAX)
    try:
        stream_mode = consumer.stream_mode
    except BaseException:
        consumer.close()
        raise
    settler = _Settler(consumer, batch_size)
    handled = itertools.count()
    count = [0]
    finished = threading.Event()
    lanes: list[queue.Queue[object]] = [queue.Queue(maxsize=max(2 * batch_size, 2)) for _ in range(concurrency)]

    def work(lane: queue.Queue[object]) -> None:
        while (item := lane.get()) is not _STOP:
            assert isinstance(item, Message)
            verb = "ack"
            try:
                handler(item)
            except Exception:  # noqa: BLE001 - a failing handler nacks its message
                log.debug("handler failed on %r", item, exc_info=True)
                verb = "nack"
            if ack == "manual" and not item.settled:
                verb = "nack"
            if not item.settled:
                settler.queue.put((verb, item))
            count[0] = next(handled) + 1
            if limit is not None and count[0] >= limit:
                finished.set()

    workers = [threading.Thread(target=work, args=(lane,), daemon=True, name=f"raftbroker-handler-{i}")
               for i, lane in enumerate(lanes)]
    for worker in workers:
        worker.start()
    def watch() -> None:
        _wait_any(stop, finished)
        consumer.close()

    watcher = threading.Thread(target=watch, daemon=True, name="raftbroker-run-stop")
    watcher.start()
    dispatched = 0
    try:
        for item in consumer:
            if isinstance(item, Event):
                continue
            lane = item.partition % concurrency if stream_mode else dispatched % concurrency
            lanes[lane].put(item)
            dispatched += 1
            if limit is not None and dispatched >= limit:
                break
    finally:
        for lane in lanes:
            lane.put(_STOP)
        for worker in workers:
            worker.join()
        settler.stop()
        finished.set()
        consumer.close()
    return count[0]


def _wait_any(stop: threading.Event | None, finished: threading.Event) -> None:
    while not finished.wait(0.1):
        if stop is not None and stop.is_set():
            return


class GroupsMixin:
    """Consumer-group methods of :class:`~broker.client.Client`."""

    _router: Router

    @property
    def groups(self) -> Groups:
        """Group administration: lag, seek/replay, pause/resume, dead letters, delete."""
        return Groups(self._router)

    def _subscribe_group(self, topic: str, group: str, **options: Any) -> Consumer:
        return Consumer(self._router, topic, group, **options)

    def run(self, topic: str, *, group: str, handler: Handler, ack: str = "auto", concurrency: int = 1,
            batch_size: int = 1, mode: str | None = None, limit: int | None = None,
            stop: threading.Event | None = None, on_event: Callable[[Event], None] | None = None,
            **options: Any) -> int:
        """Consume ``topic`` as a member of ``group`` with ``handler`` until ``stop`` is set, the
        stream ends (``stop_at_end=True``) or ``limit`` messages were handled; returns how many.
        ``options``: as for ``subscribe`` (group config such as ``visibility_timeout_ms``,
        ``max_attempts``, ``backoff``, ``ordered``; ``start``; ``stop_at_end``). ``on_event``: the
        group's events (``skip_forward``, ``reset``, ``badmsg``); default :func:`log_event`."""
        max_in_flight = options.pop("max_in_flight", max(2 * concurrency * batch_size, concurrency + 1))
        consumer = Consumer(self._router, topic, group, mode=mode, on_event=on_event or log_event,
                            max_in_flight=max_in_flight, **options)
        return run_handler(consumer, handler, ack=ack, concurrency=concurrency, batch_size=batch_size, limit=limit,
                           stop=stop)
