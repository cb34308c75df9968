"""What an apply works with and answers: partition counters, cache changes, results, and the two
protocols the state machine is given (the change signal and the append policy).

Kept apart from ``broker.core.state_machine`` so the command handlers of every feature module
(append, retention, groups, routes, members) and the leader can name them without the state
machine itself.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.core.errors import BrokerError
from broker.storage import Batch
from broker.v1 import internal_pb2


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Counters of one partition; replaced, never mutated, so readers see consistent values.
    ``last_timestamp_ms``: the newest record's timestamp, the floor of the next one's (0 in stores
    written before it existed: the first append sets it)."""

    start_offset: int = 0
    end_offset: int = 0
    records: int = 0
    bytes: int = 0
    last_timestamp_ms: int = 0

    def to_proto(self) -> internal_pb2.PartitionMeta:
        return internal_pb2.PartitionMeta(
            start_offset=self.start_offset, end_offset=self.end_offset, records=self.records,
            bytes=self.bytes, last_timestamp_ms=self.last_timestamp_ms,
        )

    @staticmethod
    def from_proto(m: internal_pb2.PartitionMeta) -> PartitionState:
        return PartitionState(m.start_offset, m.end_offset, m.records, m.bytes, m.last_timestamp_ms)


@dataclass
class CacheChanges:
    """What an apply changes in the read caches, published only after its batch is written."""

    partitions: dict[tuple[int, int], PartitionState] = field(default_factory=dict)
    created: list[internal_pb2.TopicMeta] = field(default_factory=list)
    dropped: list[internal_pb2.TopicMeta] = field(default_factory=list)
    # feature caches to update once the batch is written (e.g. consumer-group versions); readers are woken
    after_write: list[Callable[[], None]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.partitions or self.created or self.dropped or self.after_write)


Handler = Callable[[Any, Batch, CacheChanges], object]


class ChangeSignal(Protocol):
    """Wakes readers after an apply that changed topics or records (``broker.leader.changes.Changes``).

    The apply side only calls :meth:`notify`; waiting is the business of whoever reads. It is
    injected so that this module stays free of threads and clocks."""

    @property
    def version(self) -> int:
        """Increases with every :meth:`notify`."""
        ...

    def notify(self) -> None:
        """Increase :attr:`version` and wake every waiter."""
        ...

    def wait(self, seen_version: int, timeout_s: float) -> int:
        """Block until :attr:`version` differs from ``seen_version`` or ``timeout_s`` passes; the version."""
        ...

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the notifying thread after every :meth:`notify` (quick, non-blocking)."""
        ...

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener`` (matched with ``==``, so the same bound method given again matches)."""
        ...


@dataclass(frozen=True, slots=True)
class PendingRecords:
    """The records of one partition written by the apply in progress (in its batch, not yet in
    the store): offsets ``first``, ``first + 1``…, all stamped ``timestamp_ms``."""

    first: int
    timestamp_ms: int
    bodies: Sequence[bytes]

    def sizes(self) -> Iterator[tuple[int, int]]:
        """(offset, body bytes) of each, oldest first."""
        return zip(itertools.count(self.first), map(len, self.bodies))


class AppendPolicy(Protocol):
    """What the retention module decides around each append (see ``broker.core.retention``)."""

    def check(self, meta: internal_pb2.TopicMeta, partition: int, state: PartitionState, new_records: int,
              new_bytes: int) -> BrokerError | None: ...

    def after_append(self, meta: internal_pb2.TopicMeta, partition: int, state: PartitionState, batch: Batch,
                     changes: CacheChanges, pending: PendingRecords) -> PartitionState: ...


@dataclass(frozen=True, slots=True)
class Rejected:
    """The deterministic result of a command that was not applied."""

    error: BrokerError


Placed = tuple[int, int, int, bool]  # (partition, offset, timestamp_ms, duplicate) of one record


class Appended:
    """Where each record of an applied append went, in command order: :attr:`placements` holds
    (partition, offset, timestamp_ms, duplicate) per record. A duplicate of an idempotency key
    carries the first copy's place; one below its producer's watermark carries offset 0 and
    timestamp 0 (it was discarded and its original place is not kept).

    Two forms, one meaning. ``head`` lists placements one by one (the general path: keys, dedup
    fields, discarded records). The records after it may come as runs instead (the common batch,
    every record stored): ``partitions`` gives each one's partition in command order and
    ``runs[p]`` the (first offset, timestamp_ms) of partition ``p``'s records, which took
    consecutive offsets in command order. Every replica's apply builds an ``Appended`` and only the
    leader reads it, so the runs cost no Python object per record: :attr:`placements` expands them
    on first read (a per-record answer), :meth:`ranges` reads them as they are (the compact answer).
    Not replicated state: never stored, never compared across replicas."""

    __slots__ = ("_head", "_partitions", "_runs", "_expanded")

    def __init__(self, head: list[Placed], partitions: Sequence[int] = (),
                 runs: dict[int, tuple[int, int]] | None = None) -> None:
        if partitions and runs is None:
            raise ValueError("records in runs need their runs")
        self._head = head
        self._partitions = partitions
        self._runs = runs or {}
        self._expanded: list[Placed] | None = None if partitions else head

    def __len__(self) -> int:
        return len(self._head) + len(self._partitions)

    def __repr__(self) -> str:
        return f"Appended({self.placements!r})"

    @property
    def placements(self) -> list[Placed]:
        """One (partition, offset, timestamp_ms, duplicate) per record, in command order."""
        if self._expanded is None:
            self._expanded = self._head + _expand(self._partitions, self._runs)
        return self._expanded

    def ranges(self) -> list[tuple[int, int, int, int]] | None:
        """(partition, first offset, count, timestamp_ms) per partition in the order each first
        appears, when every record is in runs (none listed one by one); else None."""
        if self._head or not self._partitions:
            return None
        partitions = self._partitions
        if len(self._runs) == 1:
            ((partition, (first, ts)),) = self._runs.items()
            return [(partition, first, len(partitions), ts)]
        counts = Counter(partitions)
        runs = self._runs
        return [(p, runs[p][0], counts[p], runs[p][1]) for p in dict.fromkeys(partitions)]


def _expand(partitions: Sequence[int], runs: dict[int, tuple[int, int]]) -> list[Placed]:
    """The placements of records in runs (see :class:`Appended`)."""
    n = len(partitions)
    if len(runs) == 1:
        ((partition, (first, ts)),) = runs.items()
        return list(zip(itertools.repeat(partition, n), range(first, first + n), itertools.repeat(ts, n),
                        itertools.repeat(False, n), strict=True))
    following = {p: first for p, (first, _) in runs.items()}
    out: list[Placed] = []
    for p in partitions:
        offset = following[p]
        following[p] = offset + 1
        out.append((p, offset, runs[p][1], False))
    return out
