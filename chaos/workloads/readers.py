"""Stateless readers: each tails one partition from the earliest offset with the SDK's
subscription (which resumes by itself across failovers) and records what it was delivered.

Deliveries are recorded in chunks (``read`` entries of up to ``CHUNK_RECORDS`` records); events
(``read-event``) at once. If the subscription fails for good, the reader records ``read-restart``
and subscribes again from the offset after the last record it got.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from broker.client import BrokerError, Client, Event, Record, Subscription
from chaos.history import History

CHUNK_RECORDS = 500
CHUNK_S = 0.5


class Reader(threading.Thread):
    """Reads ``topic``/``partition`` until :meth:`halt`."""

    def __init__(self, name: str, make_client: Callable[[], Client], topic: str, partition: int,
                 history: History) -> None:
        super().__init__(name=name, daemon=True)
        self.process = name
        self.client = make_client()
        self.topic = topic
        self.partition = partition
        self.history = history
        self.halted = threading.Event()
        self.next_offset = 0
        self.count = 0
        self._sub: Subscription | None = None
        self._lock = threading.Lock()
        self._chunk: list[list[Any]] = []
        self._chunk_started = time.monotonic()

    def _flush(self) -> None:
        if self._chunk:
            self.history.info(self.process, "read", {"topic": self.topic, "partition": self.partition,
                                                     "records": self._chunk})
            self._chunk = []
        self._chunk_started = time.monotonic()

    def _deliver(self, item: Record | Event) -> None:
        if isinstance(item, Event):
            self._flush()
            self.history.info(self.process, "read-event", {
                "topic": self.topic, "partition": self.partition, "event": item.type,
                "offset_before": item.offset_before, "offset_after": item.offset_after, "detail": item.detail})
            if item.type in ("skip_forward", "gap", "badmsg"):
                self.next_offset = max(self.next_offset, item.offset_after)
            return
        self._chunk.append([item.offset, item.value.decode(errors="replace")])
        self.next_offset = item.offset + 1
        self.count += 1
        if len(self._chunk) >= CHUNK_RECORDS or time.monotonic() - self._chunk_started > CHUNK_S:
            self._flush()

    def run(self) -> None:
        first = True
        while not self.halted.is_set():
            if not first:
                self.history.info(self.process, "read-restart", {"topic": self.topic, "partition": self.partition,
                                                                 "from": self.next_offset})
            first = False
            try:
                with self._lock:
                    if self.halted.is_set():
                        break
                    self._sub = self.client.subscribe(self.topic, partition=self.partition, start=self.next_offset)
                for item in self._sub:
                    self._deliver(item)
                    if self.halted.is_set():
                        break
            except BrokerError as err:
                if not self.halted.is_set():
                    self._flush()
                    self.history.info(self.process, "read-error", {"partition": self.partition, "error": err.code,
                                                                   "message": err.message[:300]})
                    self.halted.wait(0.2)  # back off before subscribing again
            except Exception as err:  # a closed channel at halt, or an SDK bug: recorded
                if not self.halted.is_set():
                    self.history.info(self.process, "read-error", {"partition": self.partition,
                                                                   "error": type(err).__name__, "message": str(err)})
                    self.halted.wait(0.2)
        self._flush()

    def halt(self) -> None:
        with self._lock:
            self.halted.set()
            if self._sub is not None:
                self._sub.close()

    def close(self) -> None:
        self.client.close()
