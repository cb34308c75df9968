"""A complete single-node :class:`broker.replication.Replicator` without a network or a journal.

For unit tests of the core and the deterministic simulator: ``submit`` applies the command at once,
on the caller's thread, at the next index, and calls the callback before returning. A test can make
the node step down (:meth:`InMemoryReplicator.step_down`) to exercise NOT_LEADER/NO_LEADER paths.
"""

from __future__ import annotations

import logging
import threading

from broker.replication import (
    Callback,
    CommandPieces,
    FailReason,
    ReplicaStatus,
    ReplicationError,
    Role,
    StateMachine,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_COMMAND_BYTES = 4 * 1024 * 1024


class InMemoryReplicator:
    """Single-node replicator: leader from :meth:`start`, indexes continue after the state machine's
    applied index, every submit is applied synchronously in submission order (a lock serializes
    concurrent submitters). Exceptions raised by the state machine propagate to the submitter."""

    def __init__(
        self,
        state_machine: StateMachine,
        self_address: str = "memory:0",
        max_command_bytes: int = DEFAULT_MAX_COMMAND_BYTES,
    ) -> None:
        assert max_command_bytes > 0
        self._state_machine = state_machine
        self._self_address = self_address
        self._max_command_bytes = max_command_bytes
        self._lock = threading.RLock()
        self._started = False
        self._closed = False
        self._term = 0
        self._last_index = 0
        self._role = Role.FOLLOWER
        self._leader: str | None = None
        self.compactions = 0
        self.synced_submits = 0

    def start(self) -> None:
        """Become leader of a one-node group (a new term, like a restart)."""
        with self._lock:
            assert not self._started, "start() may be called once"
            self._started = True
            self._last_index = max(self._last_index, self._state_machine.applied_index())
            self._become_leader()

    def _become_leader(self) -> None:
        self._term += 1
        self._role = Role.LEADER
        self._leader = self._self_address

    def submit(self, command: bytes | CommandPieces, callback: Callback, *, sync: bool = False) -> None:
        """Apply ``command`` at the next index and call ``callback`` before returning (there is no
        journal, so ``sync`` changes nothing; ``synced_submits`` counts it for tests)."""
        if sync:
            self.synced_submits += 1
        if isinstance(command, CommandPieces):
            command = command.joined()
        if len(command) > self._max_command_bytes:
            size, limit = len(command), self._max_command_bytes
            callback(None, ReplicationError(FailReason.TOO_LARGE, f"{size} > {limit} bytes"))
            return
        with self._lock:
            error = self._refusal()
            if error is None:
                index = self._last_index + 1
                result = self._state_machine.apply(index, command)
                self._last_index = index
        if error is not None:
            callback(None, error)
        else:
            callback(result, None)

    def _refusal(self) -> ReplicationError | None:
        if not self._started or self._closed:
            return ReplicationError(FailReason.NO_LEADER, "replicator is not running")
        if self._role is not Role.LEADER:
            if self._leader is None:
                return ReplicationError(FailReason.NO_LEADER)
            return ReplicationError(FailReason.NOT_LEADER, self._leader)
        return None

    def status(self) -> ReplicaStatus:
        with self._lock:
            return ReplicaStatus(
                self_address=self._self_address,
                role=self._role,
                term=self._term,
                commit_index=self._last_index,
                applied_index=self._last_index,
                leader_address=self._leader,
                has_quorum=self._started and not self._closed,
            )

    def step_down(self, leader_address: str | None = None) -> None:
        """Test hook: become a follower of ``leader_address`` (None: no leader known)."""
        with self._lock:
            self._role = Role.FOLLOWER
            self._leader = leader_address

    def become_leader(self) -> None:
        """Test hook: win an election (a new term)."""
        with self._lock:
            assert self._started and not self._closed
            self._become_leader()

    def members(self) -> list[str]:
        """A one-node group."""
        return [self._self_address]

    def add_member(self, raft_address: str, callback: Callback) -> None:
        """There is no network to add a node to: refused."""
        callback(None, ReplicationError(FailReason.DISCARDED, "an in-memory replicator has no other members"))

    def remove_member(self, raft_address: str, callback: Callback) -> None:
        callback(None, ReplicationError(FailReason.DISCARDED, "an in-memory replicator has no other members"))

    def transfer_leadership(self, target_address: str | None = None) -> bool:
        """There is no other node to hand leadership to."""
        return False

    def force_compaction(self) -> None:
        """No log is kept, so there is nothing to compact; counted for tests."""
        with self._lock:
            self.compactions += 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._role = Role.FOLLOWER
            self._leader = None
