"""What a publish takes and answers on the leader side (plain values; ``broker.services.wire`` and
``broker.services.packed`` translate the public API to and from them; ``TopicLog`` publishes them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from broker.core.applied import Appended, Placed


@dataclass(slots=True)
class PublishItem:
    """One record to publish: its stored body, a serialized ``RecordBody`` with ``key``, ``value``,
    headers and ``op`` (the leader appends ``origin`` and ``msg_id``), and where and how it is
    placed and deduplicated (SPEC §4). Not frozen: a publish builds up to 100,000 of them, and a
    frozen dataclass takes about five times as long to build (treat it as read-only)."""

    body: bytes
    value: bytes
    key: bytes | None = None
    op: int = 0
    partition: int | None = None  # explicit partition; else hash of key; else round-robin
    idempotency_key: str = ""
    msg_id: int = 0  # with PublishBatch.dedup_id


@dataclass(frozen=True)
class PublishBatch:
    """A publish: all of its records are appended to ``topic``, or none.

    The records come in one of two forms. ``records``: one :class:`PublishItem` each. Or the lean
    form (``bodies`` set, ``records`` empty; ``broker.services.packed``): each record's stored body
    as it came, checked to carry only ``key``, ``value`` and ``op`` (a valid one), so no partition,
    idempotency key, msg_id or forged field; ``keys`` gives each record's key (``None``: no record
    has one, all are placed round-robin) and ``values`` the values, read only for topics with a
    schema or dedup fields."""

    topic: str
    records: Sequence[PublishItem] = ()
    dedup_id: str = ""
    first_msg_id: int = 0  # with dedup_id: a producer-session batch by range (no per-record ids)
    bodies: list[bytes] | None = None
    keys: list[bytes | None] | None = None
    values: Callable[[], Iterable[bytes]] | None = None

    @property
    def count(self) -> int:
        return len(self.bodies) if self.bodies is not None else len(self.records)

    def record_values(self) -> Iterable[bytes]:
        if self.bodies is None:
            return (r.value for r in self.records)
        assert self.values is not None, "a lean batch brings its values"
        return self.values()


@dataclass(frozen=True)
class Published:
    """Where a publish went: ``placed`` the apply's answer (``broker.core.applied.Appended``: the
    records of one partition that are not duplicates got consecutive offsets in request order and
    one timestamp); ``partitions`` each record's partition as placed."""

    placed: Appended
    partitions: list[int]

    @property
    def placements(self) -> list[Placed]:
        """(partition, offset, timestamp_ms, duplicate) per record in request order."""
        return self.placed.placements


@dataclass(frozen=True)
class Placement:
    """Where one published record went (in request order)."""

    partition: int
    offset: int
    timestamp_ms: int
    duplicate: bool
