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

It is a check on the leader, not a rule of the state machine: the counters it sums are replicated,
so every leader decides alike, but a node restarted since records of a ``memory`` topic were
written counts none of them (it lost its copy), and may let the others hold up to twice the
budget until those records age out. Bodies are what is counted; a node's memory holds somewhat
more (keys, framing and the store's own overhead).
"""

from __future__ import annotations

from broker.core.errors import ResourceExhausted
from broker.core.state_machine import BrokerStateMachine
from broker.v1 import internal_pb2

_REMEDY = "raise max_memory_topics_bytes on every node, or use durability disk"


def _counted(state: BrokerStateMachine, meta: internal_pb2.TopicMeta) -> int:
    if meta.config.retention.HasField("max_bytes"):
        return meta.config.partitions * meta.config.retention.max_bytes
    return sum(state.partition(meta.topic_id, p).bytes for p in range(meta.config.partitions))


def _total(state: BrokerStateMachine, leaving_out: int = 0) -> int:
    """What every ``memory`` topic but ``leaving_out`` (a topic id) holds or reserves."""
    return sum(_counted(state, m) for m in state.topics()
               if m.config.durability == internal_pb2.DURABILITY_MEMORY and m.topic_id != leaving_out)


def check_append(state: BrokerStateMachine, meta: internal_pb2.TopicMeta, new_bytes: int, budget: int) -> None:
    """Raise ResourceExhausted if appending ``new_bytes`` of record bodies to ``meta`` (a topic of
    any class) would take the ``memory`` topics past ``budget``."""
    if meta.config.durability != internal_pb2.DURABILITY_MEMORY or meta.config.retention.HasField("max_bytes"):
        return
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
