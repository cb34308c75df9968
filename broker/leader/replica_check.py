"""The leader compares the members' apply digests now and then (docs/operations.md, "Verifying
replicas"), so that a node deciding commands differently is reported without anyone asking.

:meth:`ReplicaCheck.check_if_due`, a housekeeping task, runs ``VerifyReplicas``' comparison every
``period_s``. The nodes it names are logged (ERROR, once per change) and counted in the gauge
``raftbroker_replicas_differing``, which only the leader exports: a former leader's last count
would otherwise keep an alert firing after the divergence was repaired. A node that becomes the
leader again compares at once (:meth:`ReplicaCheck.make_due`, called by the housekeeper) rather
than a period after its last comparison.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class ReplicaCheck:
    """The last comparison of the members' apply digests, repeated every ``period_s``."""

    def __init__(self, compare: Callable[[], tuple[int, tuple[str, ...]]], period_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``compare()``: every member's digest compared at one index (``VerifyReplicas``): that index
        and the nodes that differ there."""
        self._compare = compare
        self._period_s = period_s
        self._clock = clock
        self._next = 0.0
        self.differing: tuple[str, ...] = ()  # named by the last comparison that could be made
        self.checked_index = 0

    def make_due(self) -> None:
        """Compare at the next :meth:`check_if_due` (this node has just become the leader: what it
        found when it last led may be out of date, and the gauge exports it again from now on)."""
        self._next = 0.0

    def check_if_due(self) -> None:
        """Compare the digests when ``period_s`` has passed since the last time (a housekeeping
        task: the leader only; an error leaves the last result and is retried next period)."""
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._period_s
        index, differing = self._compare()
        if differing and differing != self.differing:
            log.error("replicas differ: at index %d, %s decided some command differently from the other nodes "
                      "(raftbroker cluster verify; docs/operations.md, \"Verifying replicas\")",
                      index, ", ".join(differing))
        elif self.differing and not differing:
            log.warning("replicas agree again at index %d", index)
        self.differing, self.checked_index = differing, index
