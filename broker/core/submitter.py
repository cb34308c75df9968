"""Submitting commands through the replicator and waiting, with a bound, for their outcome."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from broker.core.errors import InvalidArgument, NotLeader, ResourceExhausted, Unavailable
from broker.replication import FailReason, ReplicationError, Replicator, Role
from broker.v1 import internal_pb2


@dataclass(frozen=True)
class Peer:
    """A cluster member as configured: Raft and gRPC addresses."""

    node_id: str
    raft_address: str
    grpc_address: str
    metrics_address: str = ""


class PeerDirectory:
    """Maps Raft addresses (what the replicator knows) to members (what clients need)."""

    def __init__(self, peers: list[Peer]) -> None:
        self._by_raft = {p.raft_address: p for p in peers}

    def by_raft(self, raft_address: str | None) -> Peer | None:
        return self._by_raft.get(raft_address) if raft_address else None

    def all(self) -> list[Peer]:
        return list(self._by_raft.values())


class _Waiter:
    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: object = None
        self.error: ReplicationError | None = None

    def __call__(self, result: object, error: ReplicationError | None) -> None:
        self.result, self.error = result, error
        self.done.set()


class CommandSubmitter:
    """Leader-only submission with a bounded wait; never hangs a caller."""

    def __init__(self, replicator: Replicator, peers: PeerDirectory, commit_timeout_s: float) -> None:
        self._replicator = replicator
        self._peers = peers
        self._timeout_s = commit_timeout_s

    def leader_grpc_address(self) -> str | None:
        peer = self._peers.by_raft(self._replicator.status().leader_address)
        return peer.grpc_address if peer else None

    def ensure_leader(self) -> None:
        """Raise :class:`NotLeader` or :class:`Unavailable` unless this node can commit now."""
        status = self._replicator.status()
        if status.role != Role.LEADER:
            leader = self._peers.by_raft(status.leader_address)
            if leader is None:
                raise Unavailable("no leader is elected (election in progress or no quorum); retry later")
            raise NotLeader(leader.grpc_address)
        if not status.has_quorum:
            raise Unavailable("the leader cannot reach a majority of the cluster (no quorum); nothing was written")

    def leader_term(self) -> int:
        """The current term, checking that this node leads it."""
        self.ensure_leader()
        return self._replicator.status().term

    def submit(self, command: internal_pb2.Command, *, sync: bool = False) -> object:
        """Replicate ``command``; return the state machine's result once applied here.

        ``sync=True`` (``fsync`` topics): acknowledged only once a majority has fsynced it."""
        self.ensure_leader()
        waiter = _Waiter()
        self._replicator.submit(command.SerializeToString(), waiter, sync=sync)
        if not waiter.done.wait(self._timeout_s):
            raise Unavailable(
                f"not committed within {self._timeout_s:g} s (quorum lost or overloaded); "
                "the write may or may not be applied"
            )
        if waiter.error is not None:
            raise self._map(waiter.error)
        return waiter.result

    def _map(self, error: ReplicationError) -> Exception:
        reason = error.reason
        if reason == FailReason.NOT_LEADER:
            return NotLeader(self.leader_grpc_address())
        if reason == FailReason.QUEUE_FULL:
            return ResourceExhausted("the replication queue is full; retry with back-off")
        if reason == FailReason.TOO_LARGE:
            return InvalidArgument(f"command too large for replication: {error}")
        if reason == FailReason.DISCARDED:
            return Unavailable("leadership changed before the write committed; it was not applied")
        return Unavailable(f"replication failed ({reason.value}): {error}")
