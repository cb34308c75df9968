"""A running digest of apply outcomes, so that replicas that diverge say so
(docs/design/command-formats.md, point 5).

Every node applies every committed command with its own code. When two nodes' code disagrees about
a command (one applies it, the other records a failure or a different rejection), their data
differ and nothing else reports it. Each node therefore folds every apply into a CRC32C:

    digest(i) = crc32c(>Q index + outcome, seed=digest(previous apply))

``outcome`` is ``ok`` for a command that was applied, else the reason of its rejection
(``TOPIC_NOT_FOUND``, ``APPLY_FAILED`` for one whose apply raised, ...): stable strings, never
renamed (``broker.reasons``). Equal logs applied by equal code give equal digests at every index;
a node whose digest differs at an index all of them have applied decided some command differently.

The digests begin when the cluster's command format reaches :data:`DIGEST_FORMAT`: at the index of
that ``set_format``, on every node alike (value 0 there), so nodes upgraded at different times
still agree. Below it nothing is folded.

Layout: ``Column.META`` ``apply_digest`` -> >QQI (started index, index of the last fold, digest),
written in the apply's own batch, so a restart or a restored snapshot goes on from the same value.
In memory a node keeps its last :data:`RECENT_MAX` (index, digest) pairs, so that nodes applying at
different speeds can be compared at one index (``VerifyReplicas``).
"""

from __future__ import annotations

import bisect
import collections
import struct

import google_crc32c

from broker.core.applied import Rejected
from broker.core.errors import FailedPrecondition, NotFound
from broker.storage import Batch, Column, Store

DIGEST_FORMAT = 2  # the command format from which every node folds its applies (core/formats.py)
KEY = b"apply_digest"  # in Column.META
RECENT_MAX = 8192  # (index, digest) pairs kept in memory
_STORED = struct.Struct(">QQI")
_INDEX = struct.Struct(">Q")
_CRC_MAX = 0xFFFFFFFF
_OK = b"ok"


def outcome(result: object) -> bytes:
    """What an apply's result contributes: ``ok``, or the reason it was rejected."""
    return str(result.error.reason).encode() if isinstance(result, Rejected) else _OK


class ApplyDigests:
    """The node's running digest (written only by the state machine's apply) and its recent values
    (read by any thread: each read takes one snapshot of them, and every write replaces or appends
    one object, so no lock is needed)."""

    def __init__(self) -> None:
        self._started: int | None = None  # None: the cluster's format is below DIGEST_FORMAT
        self._value = 0
        self._recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=RECENT_MAX)

    def load(self, store: Store) -> None:
        """Go on from what ``store`` holds (after an open or a restored snapshot)."""
        raw = store.get(Column.META, KEY)
        if raw is None:
            self._started, self._value = None, 0
            self._recent = collections.deque(maxlen=RECENT_MAX)
            return
        started, index, value = _STORED.unpack(raw)
        self._recent = collections.deque([(index, value)], maxlen=RECENT_MAX)
        self._started, self._value = started, value

    @property
    def active(self) -> bool:
        return self._started is not None

    def start(self, batch: Batch, index: int) -> None:
        """The ``set_format`` at ``index`` raises the cluster's format to :data:`DIGEST_FORMAT` or
        past it: the digests begin there, at 0. Call :meth:`advance` once ``batch`` is written."""
        batch.put(Column.META, KEY, _STORED.pack(index, index, 0))

    def fold(self, batch: Batch, index: int, result: object) -> int:
        """The digest after the apply at ``index`` whose result is ``result``, put in ``batch``; call
        :meth:`advance` with it once the batch is written."""
        assert self._started is not None
        value = google_crc32c.extend(self._value, _INDEX.pack(index) + outcome(result))
        batch.put(Column.META, KEY, _STORED.pack(self._started, index, value))
        return value

    def advance(self, index: int, value: int, *, started: bool = False) -> None:
        """The batch holding ``value`` at ``index`` is written (``started``: by :meth:`start`)."""
        self._value = value
        self._recent.append((index, value))
        if started:
            self._started = index

    def at(self, index: int, applied_index: int) -> tuple[int, int]:
        """(digest at ``index``, started index), the node having applied through ``applied_index``.

        Raises FailedPrecondition before the digests began or for an index not applied yet, and
        NotFound for one older than what is kept (ask again at a newer index)."""
        started, recent = self._started, tuple(self._recent)  # one consistent view (the GIL)
        if started is None:
            raise FailedPrecondition(f"this node keeps no apply digest: they begin when the cluster's command "
                                     f"format reaches {DIGEST_FORMAT} (raftbroker cluster formats)")
        if index > applied_index:
            raise FailedPrecondition(f"index {index} is not applied on this node yet (applied: {applied_index})")
        if index < started:
            raise FailedPrecondition(f"the apply digests began at index {started}, after {index}")
        if not recent or index < recent[0][0]:
            oldest = recent[0][0] if recent else applied_index
            raise NotFound(f"the apply digest at index {index} is no longer kept on this node (it keeps "
                           f"{oldest} to {applied_index})")
        at = bisect.bisect_right(recent, (index, _CRC_MAX)) - 1  # the last fold at or below index
        return recent[at][1], started


def differing(digests: dict[str, int]) -> list[str]:
    """The nodes whose digest differs from the one more than half of ``digests`` hold; every node
    when there is no such majority and they do not all agree (no node can be named)."""
    counts = collections.Counter(digests.values())
    if len(counts) <= 1:
        return []
    value, count = counts.most_common(1)[0]
    if count * 2 > len(digests):
        return sorted(node for node, d in digests.items() if d != value)
    return sorted(digests)


__all__ = ["DIGEST_FORMAT", "KEY", "RECENT_MAX", "ApplyDigests", "differing", "outcome"]
