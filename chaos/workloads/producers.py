"""Producers: exactly-once batches of records to several partitions, by key or by producer session.

A record's id (``<producer>-<seq>``) is its value, so the checker can follow it into the log. Every
other producer (``p1``, ``p3``, ...) publishes as a service author would by default: no key of its
own, so the SDK sends each batch as the next range of one of its producer sessions (SPEC §4,
``broker.client.sessions``) and retries it as that same range through failovers; a duplicate from
those retries is a ``duplicate`` violation. The others give every record its id as idempotency key.

A producer has one batch in flight at a time. A batch whose outcome is unknown (the SDK gave up
retrying, or the server could not tell) is sent again with the same keys until it is acknowledged or
definitely refused (a session producer leaves it unknown: resent outside the session it would be a
new batch, and the SDK has dropped that session); if the drill stops the producer first, the batch
is kept and :meth:`Producer.settle` resends it after the faults heal, so that every record ends with
a definite outcome whenever the cluster recovers.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

from broker.client import BrokerError, Client, OutgoingRecord
from chaos.history import History

Batch = list[tuple[str, int]]  # (record id, partition)


class Producer(threading.Thread):
    """Publishes until ``stop`` is set; see the module docstring."""

    def __init__(self, name: str, make_client: Callable[[], Client], topic: str, partitions: int, history: History,
                 rng: random.Random, stop: threading.Event, max_batch: int = 8, think_s: float = 0.01,
                 session: bool = False) -> None:
        super().__init__(name=name, daemon=True)
        self.process = name
        self.client = make_client()
        self.topic = topic
        self.partitions = partitions
        self.history = history
        self.rng = rng
        self.stop_event = stop
        self.max_batch = max_batch
        self.think_s = think_s
        self.seq = 0
        self.unsettled: Batch | None = None
        self.acked = 0
        self.last_ok_invoke = -1.0  # history time of the invoke of the latest acknowledged publish
        self.session = session  # publish without keys: the SDK's producer sessions (module docstring)

    def next_batch(self) -> Batch:
        n = self.rng.randint(1, self.max_batch)
        single = self.rng.random() < 0.5
        first = self.rng.randrange(self.partitions)
        batch = []
        for _ in range(n):
            p = first if single else self.rng.randrange(self.partitions)
            batch.append((f"{self.process}-{self.seq:06d}", p))
            self.seq += 1
        return batch

    def publish(self, batch: Batch) -> str:
        """One publish call; returns its outcome: ok, fail or info."""
        invoke = self.history.invoke(self.process, "publish",
                                     {"topic": self.topic, "records": [[r, p] for r, p in batch]})
        try:
            results = self.client.publish_batch(self.topic, [
                OutgoingRecord(value=rid, partition=p, idempotency_key=None if self.session else rid)
                for rid, p in batch])
        except BrokerError as err:
            definite = err.refused  # the server refused: nothing was stored, retrying cannot help
            kind = "fail" if definite else "info"
            self.history.append(kind, self.process, "publish", {"error": err.code, "message": err.message[:300]})
            return kind
        except Exception as err:  # anything else is an unknown outcome, recorded as such
            self.history.info(self.process, "publish", {"error": type(err).__name__, "message": str(err)[:300]})
            return "info"
        self.history.ok(self.process, "publish",
                        {"results": [[r.partition, r.offset, r.duplicate] for r in results]})
        self.acked += len(batch)
        self.last_ok_invoke = invoke.time
        return "ok"

    def run(self) -> None:
        while not self.stop_event.is_set():
            batch = self.unsettled or self.next_batch()
            self.unsettled = batch if self.publish(batch) == "info" and not self.session else None
            if self.think_s:
                self.stop_event.wait(self.rng.uniform(0, self.think_s))

    def settle(self, attempts: int = 3) -> bool:
        """After the run: resend a batch of unknown outcome (same keys) until it is settled."""
        for _ in range(attempts):
            if self.unsettled is None:
                return True
            if self.publish(self.unsettled) != "info":
                self.unsettled = None
        return self.unsettled is None

    def close(self) -> None:
        self.client.close()
