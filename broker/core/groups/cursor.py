"""A group's position in one partition: a committed low-watermark plus acked ranges above it.

Pure math, no I/O. Invariants (checked by :meth:`GroupCursor.check`): the acked ranges are
sorted, disjoint, non-empty, not touching each other, and start strictly above ``committed`` (a
range reaching down to ``committed`` is folded into it). So acks may arrive in any order, the
watermark only moves forward (except through :meth:`GroupCursor.seek`), and everything below it
is settled for good.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from broker.v1 import internal_pb2


@dataclass
class GroupCursor:
    """Settled offsets of one (group, partition); mutable, owned by one apply or one reader."""

    committed: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)  # acked [begin, end) above committed
    retrying: int = 0  # records of the partition waiting for a retry (kept by the apply)
    dead: int = 0  # dead letters of the partition (kept by the apply)

    # -- encoding ----------------------------------------------------------------------------
    @staticmethod
    def decode(raw: bytes | None, default_committed: int = 0) -> GroupCursor:
        if raw is None:
            return GroupCursor(default_committed)
        msg = internal_pb2.GroupCursor.FromString(raw)
        flat = list(msg.acked)
        assert len(flat) % 2 == 0, "acked ranges come in pairs"
        ranges = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        return GroupCursor(msg.committed, ranges, msg.retrying, msg.dead)

    def encode(self) -> bytes:
        flat = [x for r in self.ranges for x in r]
        return internal_pb2.GroupCursor(committed=self.committed, acked=flat, retrying=self.retrying,
                                        dead=self.dead).SerializeToString()

    def check(self) -> None:
        """Assert the invariants (see the module docstring)."""
        previous_end = self.committed
        for begin, end in self.ranges:
            assert previous_end < begin < end, f"bad acked ranges {self.ranges} above {self.committed}"
            previous_end = end

    # -- queries -----------------------------------------------------------------------------
    def is_settled(self, offset: int) -> bool:
        if offset < self.committed:
            return True
        i = bisect.bisect_right(self.ranges, (offset, 2**64)) - 1
        return i >= 0 and self.ranges[i][0] <= offset < self.ranges[i][1]

    def acked_count(self) -> int:
        """How many offsets above ``committed`` are settled."""
        return sum(end - begin for begin, end in self.ranges)

    def unsettled(self, end_offset: int) -> int:
        """Offsets in ``[committed, end_offset)`` not settled."""
        if end_offset <= self.committed:
            return 0
        acked = sum(min(end, end_offset) - begin for begin, end in self.ranges if begin < end_offset)
        return end_offset - self.committed - acked

    def next_unsettled(self, offset: int) -> int:
        """The first offset at or after ``offset`` that is not settled."""
        offset = max(offset, self.committed)
        i = bisect.bisect_right(self.ranges, (offset, 2**64)) - 1
        if i >= 0 and self.ranges[i][0] <= offset < self.ranges[i][1]:
            return self.ranges[i][1]
        return offset

    # -- changes -----------------------------------------------------------------------------
    def ack(self, offset: int) -> bool:
        """Settle ``offset``; returns False when it was settled already."""
        if self.is_settled(offset):
            return False
        ranges = self.ranges
        i = bisect.bisect_left(ranges, (offset, offset))
        joins_left = i > 0 and ranges[i - 1][1] == offset
        joins_right = i < len(ranges) and ranges[i][0] == offset + 1
        if joins_left and joins_right:
            ranges[i - 1] = (ranges[i - 1][0], ranges[i][1])
            del ranges[i]
        elif joins_left:
            ranges[i - 1] = (ranges[i - 1][0], offset + 1)
        elif joins_right:
            ranges[i] = (offset, ranges[i][1])
        else:
            ranges.insert(i, (offset, offset + 1))
        self._fold()
        return True

    def commit_to(self, offset: int) -> bool:
        """Settle everything below ``offset`` (a stream-mode commit); never moves backwards.
        Returns whether the watermark moved."""
        if offset <= self.committed:
            return False
        self.committed = offset
        self.ranges = [(max(b, offset), e) for b, e in self.ranges if e > offset]
        self._fold()
        return True

    def seek(self, offset: int) -> None:
        """Move the watermark anywhere (an explicit seek: may go back) and forget the acks above."""
        self.committed = offset
        self.ranges = []

    def _fold(self) -> None:
        """Fold ranges that reach the watermark into it."""
        while self.ranges and self.ranges[0][0] <= self.committed:
            self.committed = max(self.committed, self.ranges.pop(0)[1])


def retry_due_ms(retry: internal_pb2.RetryState, now_ms: int) -> int:
    """When ``retry`` is due, seen from the leader clock reading ``now_ms``: its ``due_ms``, or
    ``now_ms`` when ``due_ms - now_ms`` exceeds the delay it was scheduled with (the clock went back
    since, or the forward jump it was stamped under was healed: waiting for ``due_ms`` would add the
    size of the jump). States stored without ``delay_ms`` are due at ``due_ms`` only."""
    if retry.HasField("delay_ms") and retry.due_ms - now_ms > max(retry.delay_ms, 0):
        return now_ms
    return retry.due_ms
