"""Leadership transfer that holds writes (Raft thesis §3.10).

Stock pysyncobj sends TimeoutNow only to a follower that is fully caught up and keeps appending
afterwards: under continuous writes the target is rarely caught up (the transfer is refused), and
when it is, the leader's log grows past the target's before the target's election, so the other
voters (and the old leader) refuse it; the transfer fails and is retried with several elections.

:class:`LeadershipTransferMixin` does what the thesis describes: :meth:`begin_transfer` stops the
leader accepting commands at once (queued ones fail with NOT_LEADER naming the target, so clients
are redirected there), sends TimeoutNow as soon as the target's match index reaches the end of the
log, and gives up after ``timeout_s`` (one election timeout): the leader then accepts writes again.
Runs on the replication (tick) thread; :attr:`transfer_target_address` may be read from any thread.
"""

from __future__ import annotations

import logging
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic

logger = logging.getLogger(__name__)

_LEADER_STATE = 2


class LeadershipTransferMixin:
    """Mixed into the ``SyncObj`` subclass; call :meth:`_init_transfer` before ``SyncObj.__init__``."""

    def _init_transfer(self) -> None:
        self._transfer_target: Any = None
        self._transfer_deadline = 0.0
        self._transfer_sent = False
        self.transfer_target_address: str | None = None  # one attribute: readable from any thread
        self.transfers_started = 0
        self.transfers_timed_out = 0

    def begin_transfer(self, target_address: str | None, timeout_s: float) -> bool:
        """Hold writes and hand leadership to ``target_address`` (None: the connected follower with the
        highest match index). False when this node does not lead or there is no such follower."""
        assert timeout_s > 0
        s: Any = self
        if s._SyncObj__raftState != _LEADER_STATE:
            return False
        connected = [n for n in s._SyncObj__otherNodes if n in s._SyncObj__connectedNodes]
        if target_address is not None:
            connected = [n for n in connected if str(n.id) == target_address]
        if not connected:
            return False
        match = s._SyncObj__raftMatchIndex
        target = max(connected, key=lambda n: (match.get(n, 0), str(n.id)))
        self._transfer_target = target
        self._transfer_deadline = monotonic() + timeout_s
        self._transfer_sent = False
        self.transfer_target_address = str(target.id)
        self.transfers_started += 1
        logger.info("leadership transfer to %s: writes held for at most %.2f s", target.id, timeout_s)
        self._advance_transfer()
        return True

    @property
    def transferring(self) -> bool:
        return self._transfer_target is not None

    def _advance_transfer(self) -> None:
        """Each tick: send TimeoutNow once the target holds the whole log; end on leadership loss or
        at the deadline (writes resume)."""
        target = self._transfer_target
        if target is None:
            return
        s: Any = self
        if s._SyncObj__raftState != _LEADER_STATE:
            self._end_transfer()
            return
        if monotonic() > self._transfer_deadline:
            self.transfers_timed_out += 1
            logger.warning("leadership transfer to %s did not complete in time: accepting writes again", target.id)
            self._end_transfer()
            return
        caught_up = s._SyncObj__raftMatchIndex.get(target, 0) >= s._SyncObj__getCurrentLogIndex()
        if not self._transfer_sent and caught_up:
            self._transfer_sent = True
            SyncObj.transferLeadership(s, target, None)

    def _end_transfer(self) -> None:
        self._transfer_target = None
        self._transfer_sent = False
        self.transfer_target_address = None
