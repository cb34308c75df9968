"""The request limits of the publish path: one definition each, validated where defined.

The SDK keeps copies so it can refuse before sending (``broker.client.wire.ID_CHARS_MAX``,
``broker.client.client.PUBLISH_BATCH_RECORDS_MAX``); ``tests/client/test_limits_pinned.py`` pins
every copy to the definition here. This module imports nothing of the broker (the leader's
publish and routed-append paths and the apply side may all use it).
"""

from __future__ import annotations

from dataclasses import dataclass

# An idempotency key, a producer session's dedup_id and a routed copy's key: at most this many
# characters (SPEC §4). Empty means "none" where a key is optional.
ID_CHARS_MAX = 256
BYTES_CEILING = 64 << 20  # no byte limit may exceed gRPC's largest message the node accepts
MEMORY_TOPICS_CEILING = 1 << 40


@dataclass(frozen=True)
class Limits:
    """Publish and routed-append limits; every one is checked before anything is replicated.

    ``record_bytes_max``: one record's stored body; ``batch_bytes_max``: the bodies of one request
    together; ``batch_records_max``: the records of one request. 100,000 records fit the 8 MiB
    default batch only when they are small (84 bytes each): the byte limit is what bounds a
    command's size, the record count bounds the per-record work of one apply.
    ``memory_topics_bytes_max``: the record bodies every ``memory`` topic together may hold, each
    node keeping them all in its memory (:mod:`broker.leader.memory_topics`). ``topics_max``: topics
    in the cluster, groups' dead-letter topics included (``broker.core.topics.check_topic_count``).
    """

    record_bytes_max: int = 1 << 20
    batch_bytes_max: int = 8 << 20
    batch_records_max: int = 100_000
    memory_topics_bytes_max: int = 512 << 20
    topics_max: int = 10_000

    def __post_init__(self) -> None:
        for name in ("record_bytes_max", "batch_bytes_max"):
            value = getattr(self, name)
            if not 0 < value <= BYTES_CEILING:
                raise ValueError(f"{name} must be between 1 and {BYTES_CEILING}, got {value}")
        if not 0 < self.batch_records_max <= 1_000_000:
            raise ValueError(f"batch_records_max must be between 1 and 1000000, got {self.batch_records_max}")
        if not 0 < self.topics_max <= 1_000_000:
            raise ValueError(f"topics_max must be between 1 and 1000000, got {self.topics_max}")
        if not 0 < self.memory_topics_bytes_max <= MEMORY_TOPICS_CEILING:
            raise ValueError(f"memory_topics_bytes_max must be between 1 and {MEMORY_TOPICS_CEILING}, "
                             f"got {self.memory_topics_bytes_max}")
