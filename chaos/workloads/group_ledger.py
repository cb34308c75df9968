"""What the group workload knows about one consumer group, and the only writer of its ``deliver``,
``commit`` and ``committed`` history entries (shapes: ``chaos.checkers.model``).

Why one writer: the regression check compares every committed-position observation with the
highest one *completed before it started*. The broker's acknowledgements carry no position
(``Ack`` and ``Commit`` answer nothing about the watermark), so the ledger records only facts:
- a ``commit`` of ``offset`` acknowledged by the broker proves the committed position is at least
  ``offset`` afterwards. A commit below a position already observed is a no-op for the broker and
  is not sent at all: :meth:`GroupLedger.begin_commit` invokes it (under the ledger's lock) only
  when it is above every observation completed so far, so an acknowledged commit is a lower bound
  for later observations and never a claim that the position went back;
- a ``committed`` poll (``Admin.GroupLag``, answered by the leader) is recorded when it completes,
  so the checker dates it at its completion although the leader read it earlier. It is left out
  (counted in ``ambiguous_polls``) only when it is below what was known and a commit of that
  partition was acknowledged while the poll was in flight: the leader may have answered before
  that commit applied. Every other poll is recorded as the broker answered it.
It also tracks, per partition, the prefix of offsets delivered to the group (at least once), so a
stream-mode member never commits past a record nobody in the group was delivered.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from broker.client import BrokerError, Message, PartitionLag
from chaos.history import History


class GroupLedger:
    """Shared by the members and the lag poller of one group; thread-safe."""

    def __init__(self, history: History, topic: str, group: str, partitions: int) -> None:
        assert partitions > 0
        self.history = history
        self.topic = topic
        self.group = group
        self._lock = threading.Lock()
        self._known = [0] * partitions  # highest committed position observed (completed observations)
        self._commits_ok = [0] * partitions  # acknowledged commits, per partition (poll ambiguity)
        self._prefix = [0] * partitions  # every offset below was delivered to the group at least once
        self._above: list[set[int]] = [set() for _ in range(partitions)]  # delivered, above the prefix
        self.deliveries = 0
        self.commits_ok = 0
        self.polls_recorded = 0
        self.ambiguous_polls = 0

    def _key(self, partition: int) -> dict[str, Any]:
        return {"topic": self.topic, "group": self.group, "partition": partition}

    # -- deliveries ------------------------------------------------------------------------------
    def deliver(self, process: str, member: str, message: Message) -> None:
        """Record one delivery (the record's value is its id) and advance the delivered prefix."""
        self.delivered(process, member, message.partition, message.offset, message.value.decode(errors="replace"),
                       message.delivery_attempt)

    def delivered(self, process: str, member: str, p: int, o: int, rid: str, attempt: int) -> None:
        """:meth:`deliver`, from the record's fields."""
        with self._lock:
            self.history.info(process, "deliver", {**self._key(p), "member": member, "offset": o, "id": rid,
                                                   "attempt": attempt})
            self.deliveries += 1
            if o >= self._prefix[p]:
                self._above[p].add(o)
            while self._prefix[p] in self._above[p]:
                self._above[p].discard(self._prefix[p])
                self._prefix[p] += 1

    def delivered_prefix(self, partition: int) -> int:
        """Every offset of ``partition`` below this one was delivered to the group at least once."""
        with self._lock:
            return self._prefix[partition]

    # -- commits ---------------------------------------------------------------------------------
    def begin_commit(self, process: str, partition: int, offset: int) -> bool:
        """Record the invoke of ``commit(partition, offset)`` and return True if ``offset`` is above
        every committed position observed so far (else record nothing: the commit would be a no-op)."""
        with self._lock:
            if offset <= self._known[partition]:
                return False
            self.history.invoke(process, "commit", {**self._key(partition), "offset": offset})
            return True

    def end_commit(self, process: str, partition: int, offset: int, error: Exception | None) -> None:
        """Record the outcome of the commit :meth:`begin_commit` invoked: ok, fail (definitely
        refused) or info (unknown)."""
        with self._lock:
            if error is None:
                self.history.ok(process, "commit", {**self._key(partition), "offset": offset})
                self._known[partition] = max(self._known[partition], offset)
                self._commits_ok[partition] += 1
                self.commits_ok += 1
                return
            definite = isinstance(error, BrokerError) and error.refused
            code = error.code if isinstance(error, BrokerError) else type(error).__name__
            self.history.append("fail" if definite else "info", process, "commit",
                                {**self._key(partition), "offset": offset, "error": code,
                                 "message": str(error)[:300]})

    # -- polls -----------------------------------------------------------------------------------
    def poll_token(self) -> list[int]:
        """Taken before a lag poll is sent; hand it to :meth:`polled` with the answer."""
        with self._lock:
            return list(self._commits_ok)

    def polled(self, process: str, rows: Sequence[PartitionLag], token: list[int], node: str = "",
               applied_index: int = 0) -> None:
        """Record each partition's committed position as the leader reported it (see the module doc),
        with the node that answered and the Raft index its answer reflects."""
        with self._lock:
            for row in rows:
                p = row.partition
                if p >= len(self._known):
                    continue
                if row.committed < self._known[p] and self._commits_ok[p] != token[p]:
                    self.ambiguous_polls += 1
                    continue
                self.history.info(process, "committed", {**self._key(p), "offset": row.committed,
                                                         "end": row.end_offset, "lag": row.lag,
                                                         "in_flight": row.in_flight, "retrying": row.retrying,
                                                         "dead": row.dead, "node": node,
                                                         "applied_index": applied_index})
                self._known[p] = max(self._known[p], row.committed)
                self.polls_recorded += 1

    def poll_failed(self, process: str, error: Exception) -> None:
        code = error.code if isinstance(error, BrokerError) else type(error).__name__
        self.history.fail(process, "committed", {"topic": self.topic, "group": self.group, "error": code,
                                                 "message": str(error)[:300]})
