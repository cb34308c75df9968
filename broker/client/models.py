"""Plain, typed values the SDK returns and accepts (never protobuf messages).

Every type is a frozen dataclass (and :class:`PublishResults`, a read-only sequence of them).
Names of enumerations are lower-case strings
(``"disk"``, ``"discard_old"``, ``"skip_forward"``, ``"insert"``), the same words the CLI uses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

DURABILITIES = ("ephemeral", "memory", "disk", "fsync")
FULL_POLICIES = ("discard_old", "reject")
OPS = ("insert", "update", "delete", "tombstone")
EVENT_TYPES = ("skip_forward", "reset", "badmsg", "gap")


@dataclass(frozen=True)
class Retention:
    """Retention caps of a topic; ``None`` means no cap."""

    max_age_ms: int | None = None
    max_records: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True)
class PartitionInfo:
    """One partition's retained range ``[start_offset, end_offset)`` and its size."""

    partition: int
    start_offset: int
    end_offset: int
    records: int
    bytes: int


@dataclass(frozen=True)
class TopicInfo:
    """A topic's configuration and, when the server reports them, its partitions' state."""

    name: str
    partition_count: int
    retention: Retention
    durability: str
    full_policy: str
    incarnation: int
    created_ms: int
    partitions: tuple[PartitionInfo, ...] = ()
    schema_json: str = ""  # empty in list_topics() results: describe_topic() carries the schema
    has_schema: bool = False
    dedup_fields: tuple[str, ...] = ()
    dedup_window_ms: int = 0

    @property
    def records(self) -> int:
        """Records retained over all partitions."""
        return sum(p.records for p in self.partitions)

    @property
    def bytes(self) -> int:
        """Bytes retained over all partitions."""
        return sum(p.bytes for p in self.partitions)


@dataclass(frozen=True)
class OutgoingRecord:
    """A record to publish. ``partition`` wins over ``key``; neither means round-robin.

    ``idempotency_key`` (at most 256 characters): a repeat of the key within the topic's dedup
    window stores nothing and answers the first copy's place with ``duplicate=True``. ``None``
    on every record of a batch: the batch goes in the client's producer session (retries are
    safe); ``None`` beside a keyed record: the client chooses a random key for it (the same one on
    every retry of one call).
    ``msg_id``: this record's id in a producer session (``Client.publish_batch(dedup_id=...)``).
    """

    value: bytes | str
    key: bytes | str | None = None
    partition: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    op: str = "insert"
    idempotency_key: str | None = None
    msg_id: int | None = None


@dataclass(frozen=True)
class PublishResult:
    """Where one published record is stored.

    ``duplicate``: the broker already had this record and stored nothing new. For a repeated
    idempotency key, ``partition``/``offset``/``timestamp_ms`` are the first copy's (which may
    have been stored by an earlier attempt of the same call whose answer was lost); the same for
    a retried batch of the SDK's producer session (the broker keeps its last batch's places). For
    a ``msg_id`` at or below its producer session's watermark outside that last batch, no original
    place is kept: ``partition`` is where it would have gone and ``offset`` and ``timestamp_ms`` are
    0 (:attr:`place_known` is False: do not read ``offset`` as a place, 0 is another record's).
    ``idempotency_key`` is the key the record was sent with (the caller's or the generated one;
    "" when the batch went in the SDK's producer session, which sends no per-record key).
    """

    partition: int
    offset: int
    duplicate: bool
    timestamp_ms: int
    idempotency_key: str = ""

    @property
    def place_known(self) -> bool:
        """False only for a duplicate whose original place is not kept (a session ``msg_id`` at or
        below the watermark; the broker marks it with ``timestamp_ms`` 0, which no stored record has)."""
        return not (self.duplicate and self.timestamp_ms == 0)


class PublishResults(Sequence[PublishResult]):
    """One :class:`PublishResult` per published record, in request order: a read-only sequence
    (``len``, indexing, slices, iteration, ``+`` and ``==`` with a list). The answer is checked when it
    arrives; the per-record objects are made when the results are first read, so a caller that
    only needs to know the batch is stored does not pay for them (about 0.5 us per record, a
    fifth of the SDK's CPU for 100-byte values)."""

    __slots__ = ("_count", "_make", "_made")

    def __init__(self, count: int, make: Callable[[], list[PublishResult]]) -> None:
        self._count = count
        self._make = make
        self._made: list[PublishResult] | None = None

    def _all(self) -> list[PublishResult]:
        made = self._made
        if made is None:  # threads racing here both make the same list; either is kept
            made = self._made = self._make()
        return made

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> PublishResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[PublishResult]: ...

    def __getitem__(self, index: int | slice) -> PublishResult | list[PublishResult]:
        return self._all()[index]

    def __iter__(self) -> Iterator[PublishResult]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PublishResults):
            return self._all() == other._all()
        if isinstance(other, list):
            return self._all() == other
        return NotImplemented

    def __add__(self, other: Sequence[PublishResult]) -> list[PublishResult]:
        return [*self._all(), *other]

    def __radd__(self, other: Sequence[PublishResult]) -> list[PublishResult]:
        return [*other, *self._all()]

    __hash__ = None  # type: ignore[assignment]  # compared by content, like the list it stands for

    def __repr__(self) -> str:
        return repr(self._all())


@dataclass(frozen=True)
class Watermark:
    """A producer session's high watermark on a topic: the highest ``|msg_id|`` stored."""

    dedup_id: str
    msg_id: int


@dataclass(frozen=True)
class Record:
    """A stored record as delivered. ``position`` is the opaque token to resume right after it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Mapping[str, str]
    timestamp_ms: int
    position: bytes
    producer: str = ""
    op: str = "insert"
    origin: str = ""
    msg_id: str = ""


@dataclass(frozen=True, eq=False)
class Batch:
    """Consecutive records of one partition as :meth:`Client.subscribe_batches` delivers them:
    record ``i`` is at offset ``first_offset + i`` with value ``values[i]`` and timestamp
    ``timestamps_ms[i]``. No object is made per record: ``keys()`` and ``headers()`` build their
    lists when called, and there is no :class:`Record` (use :meth:`Client.subscribe` for those). A
    batch has one position, ``next_position``: subscribing from it continues right after the last
    record; a record within it is named by its offset."""

    topic: str
    partition: int
    first_offset: int
    values: list[bytes]
    timestamps_ms: list[int]
    next_position: bytes
    _messages: Sequence[Any] = field(repr=False)  # the records as received (protobuf Records)

    def __len__(self) -> int:
        return len(self.values)

    @property
    def offsets(self) -> range:
        return range(self.first_offset, self.first_offset + len(self.values))

    @property
    def next_offset(self) -> int:
        """The offset right after the last record."""
        return self.first_offset + len(self.values)

    def keys(self) -> list[bytes | None]:
        return [m.key if m.HasField("key") else None for m in self._messages]

    def headers(self) -> list[dict[str, str]]:
        return [dict(m.headers) for m in self._messages]

    def ops(self) -> list[str]:
        return [OPS[op] if 0 <= op < len(OPS) else f"unknown({op})" for op in (m.op for m in self._messages)]

    def origins(self) -> list[str]:
        return [m.origin for m in self._messages]

    def slice(self, start: int, stop: int) -> Batch:
        """Records ``start`` … ``stop - 1`` of this batch (indexes, not offsets); ``next_position``
        is kept only when the slice ends where the batch does (else empty)."""
        start, stop, _ = slice(start, stop).indices(len(self.values))
        return Batch(topic=self.topic, partition=self.partition, first_offset=self.first_offset + start,
                     values=self.values[start:stop], timestamps_ms=self.timestamps_ms[start:stop],
                     next_position=self.next_position if stop >= len(self.values) else b"",
                     _messages=self._messages[start:stop])


@dataclass(frozen=True)
class Event:
    """A non-record item of a subscription (SPEC §3.3): data loss or a reset, never silent."""

    type: str
    topic: str
    partition: int
    offset_before: int
    offset_after: int
    position_before: bytes = b""
    position_after: bytes = b""
    detail: str = ""


@dataclass(frozen=True)
class NodeInfo:
    """One node as the cluster reports it."""

    id: str
    grpc_address: str
    role: str
    term: int
    commit_index: int
    applied_index: int
    pid: int
    reachable: bool
    leader_id: str
    raft_address: str = ""
    metrics_address: str = ""
    # command formats (docs/design/command-formats.md): the newest this node's code applies, and the
    # cluster's as this node has applied it; 0 for both from a node that predates formats
    apply_format: int = 0
    cluster_format: int = 0


@dataclass(frozen=True)
class NodeDigest:
    """One node's digest of apply outcomes at the compared index (``digest`` None, and ``error``
    saying why, when it gave none)."""

    id: str
    reachable: bool
    digest: int | None
    error: str = ""


@dataclass(frozen=True)
class ReplicaVerification:
    """Every member's apply digest at one index (``Client.verify_replicas``): ``differing`` names the
    nodes that decided some command differently from the majority (every node with a digest when
    there is no majority); ``agreed`` is true only when every member gave the same digest."""

    index: int
    nodes: tuple[NodeDigest, ...]
    differing: tuple[str, ...]
    agreed: bool


@dataclass(frozen=True)
class ClusterStatus:
    """Every node of the cluster and the leader's id (empty when there is none)."""

    leader_id: str
    nodes: tuple[NodeInfo, ...]

    @property
    def leader(self) -> NodeInfo | None:
        return next((n for n in self.nodes if n.id == self.leader_id and self.leader_id), None)
