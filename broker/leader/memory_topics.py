"""The bound on what ``memory`` topics hold (SPEC §2.1: "in memory on each node, bounded").

A ``memory`` topic keeps its records in every node's memory, so without a bound one busy topic
with no retention caps grows every node at once until each is killed for its memory: the whole
cluster together. The bound is ``Limits.memory_topics_bytes_max`` (the node's
``max_memory_topics_bytes``), in record bodies, and it works like a reservation:
- a partition with a ``max_bytes`` cap counts that cap, whether it is full or not (its apply
  trims or refuses to stay within it), so a topic with caps is checked once, when it is created
  or its caps are altered, and its publishes are never refused for the budget;
- a partition without one counts what it holds, and a publish or routed copy to it that would
  take the total past the budget is refused with RESOURCE_EXHAUSTED; nothing is replicated.

Publishes in flight count too (:class:`InFlight`): the applied counters alone let 16 concurrent
batches of 90 KB through a 100 KB budget (each checked before any was applied). A publish holds its
bytes from its check until it is answered, so for a moment after its apply they count twice.

It is a check on the leader, not a rule of the state machine: the counters it sums are replicated,
so every leader decides alike, but a node restarted since records of a ``memory`` topic were
written counts none of them (it lost its copy), and may let the others hold up to twice the
budget until those records age out. Bodies are what is counted; a node's memory holds somewhat
more (keys, framing and the store's own overhead).
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Callable

from broker.core.errors import ResourceExhausted
from broker.core.state_machine import BrokerStateMachine
from broker.v1 import internal_pb2

_REMEDY = "raise max_memory_topics_bytes on every node, or use durability disk"


def _counted(state: BrokerStateMachine, meta: internal_pb2.TopicMeta) -> int:
    if meta.config.retention.HasField("max_bytes"):
        return meta.config.partitions * meta.config.retention.max_bytes
    return sum(state.counters(meta.topic_id, p).bytes for p in range(meta.config.partitions))


def _total(state: BrokerStateMachine, leaving_out: int = 0) -> int:
    """What every ``memory`` topic but ``leaving_out`` (a topic id) holds or reserves."""
    return sum(_counted(state, m) for m in state.topics()
               if m.config.durability == internal_pb2.DURABILITY_MEMORY and m.topic_id != leaving_out)


class InFlight:
    """Bytes of ``memory``-topic publishes checked and not answered yet, on this node (thread-safe).

    A release takes no lock: it may run as a garbage-collection finalizer (``weakref.finalize`` of a
    publish dropped unanswered) at any allocation, also on a thread inside :meth:`take`, which holds
    the lock. It took the lock, and that thread waited for itself: the leader answered nothing more
    (216 refused publishes to a full topic sufficed). Releases are queued and counted at the next
    :meth:`take` or read of :attr:`bytes`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._released: collections.deque[int] = collections.deque()  # appended without the lock

    def _drain(self) -> None:
        while self._released:
            self._held -= self._released.popleft()

    @property
    def bytes(self) -> int:
        with self._lock:
            self._drain()
            return self._held

    def take(self, check: Callable[[int], None], new_bytes: int) -> Callable[[], None]:
        """``check(bytes in flight)`` (raises to refuse), then hold ``new_bytes``; returns the release
        (idempotent, lock-free)."""
        with self._lock:
            self._drain()
            check(self._held)
            self._held += new_bytes
        held = [new_bytes]

        def release() -> None:
            try:
                n = held.pop()  # atomic: a second release finds nothing
            except IndexError:
                return
            self._released.append(n)

        return release


_IN_FLIGHT: weakref.WeakKeyDictionary[BrokerStateMachine, InFlight] = weakref.WeakKeyDictionary()
_IN_FLIGHT_LOCK = threading.Lock()


def in_flight(state: BrokerStateMachine) -> InFlight:
    """The node's publishes in flight (one per state machine: every leader-side writer shares it)."""
    with _IN_FLIGHT_LOCK:
        found = _IN_FLIGHT.get(state)
        if found is None:
            found = _IN_FLIGHT[state] = InFlight()
        return found


def _nothing() -> None:
    return None


def check_append(state: BrokerStateMachine, meta: internal_pb2.TopicMeta, new_bytes: int,
                 budget: int) -> Callable[[], None]:
    """Raise ResourceExhausted if appending ``new_bytes`` of record bodies to ``meta`` (a topic of
    any class) would take the ``memory`` topics past ``budget``, counting publishes in flight; else
    hold the bytes as in flight and return what releases them once the publish is answered."""
    if meta.config.durability != internal_pb2.DURABILITY_MEMORY or meta.config.retention.HasField("max_bytes"):
        return _nothing
    return in_flight(state).take(lambda pending: _refuse_past(state, meta, pending + new_bytes, budget), new_bytes)


def _refuse_past(state: BrokerStateMachine, meta: internal_pb2.TopicMeta, new_bytes: int, budget: int) -> None:
    total = _total(state) + new_bytes
    if total > budget:
        raise ResourceExhausted(
            f"memory topics would hold {total} bytes of records, more than max_memory_topics_bytes ({budget}), "
            f"which every node keeps in memory: clear or prune memory topics, give topic {meta.config.name!r} "
            f"a max_bytes retention cap (it then reserves its cap), {_REMEDY}")


def check_config(state: BrokerStateMachine, config: internal_pb2.TopicConfig, budget: int, topic_id: int = 0) -> None:
    """Raise ResourceExhausted if a ``memory`` topic with ``config`` (a new one, or the topic
    ``topic_id`` with new caps) would reserve more than the others leave of ``budget``."""
    if config.durability != internal_pb2.DURABILITY_MEMORY or not config.retention.HasField("max_bytes"):
        return
    mine = config.partitions * config.retention.max_bytes
    others = _total(state, leaving_out=topic_id)
    if others + mine > budget:
        raise ResourceExhausted(
            f"topic {config.name!r} would reserve {mine} bytes ({config.partitions} partition(s) x max_bytes "
            f"{config.retention.max_bytes}) of every node's memory, and memory topics hold or reserve {others} "
            f"already: together more than max_memory_topics_bytes ({budget}); lower max_bytes, {_REMEDY}")
