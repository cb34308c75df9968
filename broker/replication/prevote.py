"""Raft's PreVote (Ongaro's thesis §9.6) for pysyncobj, as subclass logic: a node asks whether it
could win before it raises its term, so a node that restarts or lost contact for a moment cannot
depose a healthy leader.

pysyncobj starts an election when the election deadline has passed and ``__connectedToAnyone()``
is true; that check is the gate. When the deadline passes, :class:`PreVoteMixin` sends ``pre_vote``
(the term it would campaign in, its last log index and term) instead, restarts the deadline and
answers False. A peer grants only if it is not the leader, has not heard from a leader for
``lease_s`` (< the minimum election timeout), the proposed term is above its own and the
candidate's log is at least as up to date as its own; granting changes no state (nothing to
persist). With a majority of grants the gate opens at the next tick and pysyncobj runs its normal
election. A leadership transfer (TimeoutNow) skips the pre-vote: the leader asked for it.

Fallback: a node whose term is already above the leader's (it campaigned before PreVote, or its
real election failed) would ignore that leader's heartbeats forever (pysyncobj drops lower-term
messages) while the others deny its pre-votes. After it sees a lower-term heartbeat, its next
timeout runs one real election, which moves the whole group to its term once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj.monotonic import monotonic

_LEADER_STATE = 2


class PreVoteMixin:
    """Mixed into the ``SyncObj`` subclass before ``SyncObj``; call :meth:`_init_prevote` first."""

    def _init_prevote(self, enabled: bool, lease_s: float) -> None:
        self.prevote_enabled = enabled
        self._prevote_lease_s = lease_s
        self._prevote_term = 0  # the term of the round in progress; 0: none
        self._prevote_grants: set[str] = set()
        self._prevote_won = False
        self._last_leader_contact = float("-inf")
        self._stale_leader_seen = False
        self.prevote_rounds = 0  # diagnostics
        self.prevote_wins = 0
        # set_campaign_deferral: while it answers True, this node lets others campaign first
        self._defer_campaign: Callable[[], bool] | None = None
        self._defer_campaign_max_s = 0.0
        self._deferring_since: float | None = None
        self.campaigns_deferred = 0  # diagnostics

    def set_campaign_deferral(self, defer: Callable[[], bool] | None, max_s: float) -> None:
        """While ``defer()`` is true, this node starts no election of its own (it still votes), for at
        most ``max_s`` after its first deferred one, then campaigns as usual. A node that would serve
        badly as leader (one still taking back the `memory` records it lost: docs/design/memory-topics.md)
        leaves the leadership to a node that would not, when there is one; a transfer (TimeoutNow) is
        never deferred. ``defer`` runs on the tick thread: it must be quick and must not block."""
        assert max_s >= 0
        self._defer_campaign, self._defer_campaign_max_s = defer, max_s

    # -- the election gate ---------------------------------------------------------------------
    def _SyncObj__connectedToAnyone(self) -> bool:  # noqa: N802 (pysyncobj's mangled name)
        connected: bool = super()._SyncObj__connectedToAnyone()  # type: ignore[misc]
        s: Any = self
        if not connected or not self.prevote_enabled or not s._SyncObj__otherNodes:
            return connected
        if s._SyncObj__transferInProgress:  # TimeoutNow from the leader: elect now
            return True
        if self._prevote_won:  # only reached once the election deadline passed
            self._prevote_won = False
            return True
        if self._stale_leader_seen:  # fallback: our term is above the live leader's
            self._stale_leader_seen = False
            return True
        if self._deferring():
            s._SyncObj__raftElectionDeadline = monotonic() + s._SyncObj__generateRaftTimeout()
            return False
        self._start_prevote()
        return False

    def _deferring(self) -> bool:
        """Whether to let this election deadline pass without a pre-vote (set_campaign_deferral)."""
        defer = self._defer_campaign
        try:
            wanted = defer is not None and defer()
        except Exception:  # noqa: BLE001 - a faulty hint must never keep a node from campaigning
            wanted = False
        if not wanted:
            self._deferring_since = None
            return False
        now = monotonic()
        if self._deferring_since is None:
            self._deferring_since = now
        if now - self._deferring_since >= self._defer_campaign_max_s:
            return False
        self.campaigns_deferred += 1
        return True

    def _start_prevote(self) -> None:
        s: Any = self
        self._prevote_term = s.raftCurrentTerm + 1
        self._prevote_grants = set()
        self.prevote_rounds += 1
        message = {
            "type": "pre_vote",
            "term": self._prevote_term,
            "last_log_index": s._SyncObj__getCurrentLogIndex(),
            "last_log_term": s._SyncObj__getCurrentLogTerm(),
        }
        for node in s._SyncObj__otherNodes:
            s._SyncObj__transport.send(node, message)
        s._SyncObj__raftElectionDeadline = monotonic() + s._SyncObj__generateRaftTimeout()

    # -- messages ------------------------------------------------------------------------------
    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "pre_vote":
            self._on_pre_vote(node, message)
            return
        if kind == "pre_vote_resp":
            self._on_pre_vote_resp(node, message)
            return
        if kind == "append_entries":
            s: Any = self
            if message["term"] >= s.raftCurrentTerm:
                self._last_leader_contact = monotonic()
                self._deferring_since = None
                self._prevote_term = 0
                self._prevote_won = False
                self._stale_leader_seen = False
            elif self.prevote_enabled:
                self._stale_leader_seen = True
        super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]

    def _on_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        s: Any = self
        last_term, last_index = s._SyncObj__getCurrentLogTerm(), s._SyncObj__getCurrentLogIndex()
        up_to_date = (message["last_log_term"], message["last_log_index"]) >= (last_term, last_index)
        granted = (
            s._SyncObj__raftState != _LEADER_STATE
            and message["term"] > s.raftCurrentTerm
            and monotonic() - self._last_leader_contact >= self._prevote_lease_s
            and up_to_date
        )
        s._SyncObj__transport.send(node, {"type": "pre_vote_resp", "term": message["term"], "granted": granted})

    def _on_pre_vote_resp(self, node: Any, message: dict[str, Any]) -> None:
        s: Any = self
        if not message.get("granted") or message["term"] != self._prevote_term:
            return
        if self._prevote_term != s.raftCurrentTerm + 1 or s._SyncObj__raftState == _LEADER_STATE:
            return
        self._prevote_grants.add(node.id)
        if len(self._prevote_grants) + 1 > (len(s._SyncObj__otherNodes) + 1) / 2:
            self._prevote_term = 0
            self._prevote_won = True
            self.prevote_wins += 1
            s._SyncObj__raftElectionDeadline = 0  # campaign at the next tick
