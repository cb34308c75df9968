"""Topic configuration: validation and defaults (SPEC §2)."""

from __future__ import annotations

import re
from typing import Protocol

from broker.core.errors import InvalidArgument, ResourceExhausted, shown
from broker.v1 import internal_pb2

NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,248}\Z")
PARTITIONS_MAX = 1024
TOPICS_MAX = 10_000  # the default of a node's max_topics
DEFAULT_DEDUP_WINDOW_MS = 120_000


def validate_name(name: str) -> None:
    """Topic names: 1-249 of ``[A-Za-z0-9._-]``, starting with a letter or digit."""
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"invalid topic name {shown(name)}: use 1-249 characters of A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )


def normalized_config(config: internal_pb2.TopicConfig) -> internal_pb2.TopicConfig:
    """A validated copy of ``config`` with defaults filled in; raises :class:`InvalidArgument`."""
    validate_name(config.name)
    out = internal_pb2.TopicConfig()
    out.CopyFrom(config)
    if out.partitions == 0:
        out.partitions = 1
    if not 1 <= out.partitions <= PARTITIONS_MAX:
        raise InvalidArgument(f"partitions must be between 1 and {PARTITIONS_MAX}, got {out.partitions}")
    for field in ("max_age_ms", "max_records", "max_bytes"):
        if out.retention.HasField(field) and getattr(out.retention, field) <= 0:
            raise InvalidArgument(f"retention.{field} must be positive, got {getattr(out.retention, field)}")
    if out.full_policy == internal_pb2.FULL_POLICY_UNSPECIFIED:
        out.full_policy = internal_pb2.FULL_POLICY_DISCARD_OLD
    if out.full_policy not in (internal_pb2.FULL_POLICY_DISCARD_OLD, internal_pb2.FULL_POLICY_REJECT):
        raise InvalidArgument(f"unknown full_policy {out.full_policy}")
    if out.durability == internal_pb2.DURABILITY_UNSPECIFIED:
        out.durability = internal_pb2.DURABILITY_DISK
    if out.durability not in internal_pb2.Durability.values():
        raise InvalidArgument(f"unknown durability {out.durability}")
    if out.dedup_window_ms == 0:
        out.dedup_window_ms = DEFAULT_DEDUP_WINDOW_MS
    if out.dedup_window_ms < -1:
        raise InvalidArgument("dedup_window_ms must be positive, 0 (default) or -1 (forever)")
    check_ephemeral_caps(out)
    return out


def check_ephemeral_caps(config: internal_pb2.TopicConfig) -> None:
    """An ``ephemeral`` topic keeps no log (only the leader's bounded ring of recent records), so
    retention caps and ``full_policy=reject`` would never apply: refused rather than ignored."""
    if config.durability != internal_pb2.DURABILITY_EPHEMERAL:
        return
    caps = [f for f in ("max_age_ms", "max_records", "max_bytes") if config.retention.HasField(f)]
    if caps:
        raise InvalidArgument(f"ephemeral topics keep no log, so retention {', '.join(caps)} would never apply; "
                              "leave the caps out (or use durability memory)")
    if config.full_policy == internal_pb2.FULL_POLICY_REJECT:
        raise InvalidArgument("ephemeral topics keep no log, so full_policy reject would never apply")


class TopicCounter(Protocol):
    def topic_count(self) -> int:
        """How many topics exist now."""
        ...


def check_topic_count(state: TopicCounter, topics_max: int, what: str) -> None:
    """Leader-side: refuse one topic more than ``topics_max`` (RESOURCE_EXHAUSTED). Every topic costs
    each node's periodic housekeeping apply a visit: 46,600 of them made an idle cluster lose its
    leader every few seconds."""
    count = state.topic_count()
    if count >= topics_max:
        raise ResourceExhausted(f"{what}: the cluster has {count} topics (dead-letter topics included), the most "
                                f"max_topics ({topics_max}) allows; drop topics (or groups' dead-letter topics) "
                                "that are not used, or raise max_topics on every node")
