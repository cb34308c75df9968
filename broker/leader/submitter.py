"""Submitting commands through the replicator and waiting, with a bound, for their outcome."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Protocol

from broker.core.errors import InvalidArgument, NoQuorum, NotLeader, ResourceExhausted, Unavailable
from broker.core.members import Peer
from broker.replication import CommandPieces, FailReason, ReplicationError, Replicator, Role
from broker.v1 import internal_pb2


class MemberSource(Protocol):
    """Members added at run time (``broker.leader.membership.MemberRegistry``), by node id."""

    def members(self) -> dict[str, Peer]: ...


class PeerDirectory:
    """Maps Raft addresses (what the replicator knows) to members (what clients need): the members
    this node was configured with, and the replicated registry of members added later."""

    def __init__(self, peers: list[Peer]) -> None:
        self._by_raft = {p.raft_address: p for p in peers}
        self._registry: MemberSource | None = None
        self._current: Callable[[], list[str]] | None = None

    def attach(self, registry: MemberSource, current: Callable[[], list[str]]) -> None:
        """Consult ``registry`` too; ``current()`` gives the Raft addresses of the configuration."""
        self._registry, self._current = registry, current

    def _registered(self) -> dict[str, Peer]:
        return self._registry.members() if self._registry is not None else {}

    def by_raft(self, raft_address: str | None) -> Peer | None:
        if not raft_address:
            return None
        found = next((p for p in self._registered().values() if p.raft_address == raft_address), None)
        return found or self._by_raft.get(raft_address)

    def by_id(self, node_id: str) -> Peer | None:
        found = self._registered().get(node_id)
        return found or next((p for p in self._by_raft.values() if p.node_id == node_id), None)

    def all(self) -> list[Peer]:
        """The current members (as configured when nothing is attached)."""
        if self._current is None:
            return list(self._by_raft.values())
        return [self.by_raft(address) or Peer(address, address, "") for address in self._current()]

    def others(self, node_id: str) -> list[Peer]:
        """The current members except ``node_id`` (:meth:`all`)."""
        return [p for p in self.all() if p.node_id != node_id]


class _Waiter:
    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: object = None
        self.error: ReplicationError | None = None

    def __call__(self, result: object, error: ReplicationError | None) -> None:
        self.result, self.error = result, error
        self.done.set()


class _Expired(Exception):
    """The bound of :meth:`CommandSubmitter.submit_async` passed before the outcome came."""


def _expire(outcome: asyncio.Future[tuple[object, ReplicationError | None]]) -> None:
    if not outcome.done():
        outcome.set_exception(_Expired())


def _serialized(command: internal_pb2.Command | bytes | CommandPieces) -> bytes | CommandPieces:
    return command if isinstance(command, bytes | CommandPieces) else command.SerializeToString()


class CommandSubmitter:
    """Leader-only submission with a bounded wait; never hangs a caller."""

    def __init__(self, replicator: Replicator, peers: PeerDirectory, commit_timeout_s: float) -> None:
        self._replicator = replicator
        self._peers = peers
        self._timeout_s = commit_timeout_s

    def self_grpc_address(self) -> str:
        """This node's gRPC address (its Raft address when the directory does not know it)."""
        address = self._replicator.status().self_address
        peer = self._peers.by_raft(address)
        return peer.grpc_address if peer is not None and peer.grpc_address else address

    def leader_grpc_address(self) -> str | None:
        peer = self._peers.by_raft(self._replicator.status().leader_address)
        return peer.grpc_address if peer else None

    def ensure_leader(self) -> None:
        """Raise :class:`NotLeader`, :class:`NoQuorum` or :class:`Unavailable` unless this node can
        commit now. ``has_quorum`` is this node's view of its Raft connections (any role): without
        it, no leader can be elected with this node, which says so (:class:`NoQuorum`) rather than
        asking the caller to wait for an election. A leader that has not yet applied what was
        committed before its term (``leader_ready``) is :class:`Unavailable`: every check a caller
        makes after this one reads the state machine, which would answer from before those writes
        (a topic created earlier would be reported missing)."""
        status = self._replicator.status()
        if status.role != Role.LEADER:
            leader = self._peers.by_raft(status.leader_address)
            if leader is not None:  # without a quorum here, a leader known from before may be gone
                raise NotLeader(leader.grpc_address, no_quorum=not status.has_quorum)
            if not status.has_quorum:
                raise NoQuorum(f"no quorum: this node reaches less than a majority of the {self._member_count()} "
                               "members, so no leader can be elected; nothing was written (start or reconnect "
                               "the missing nodes)")
            raise Unavailable("no leader is elected yet (election in progress); retry later")
        if not status.has_quorum:
            raise NoQuorum(f"no quorum: the leader reaches less than a majority of the {self._member_count()} "
                           "members; nothing was written (start or reconnect the missing nodes)")
        if not status.leader_ready:  # its state may miss entries committed before its term
            raise Unavailable("this node was just elected and is still applying the writes committed before "
                              "its term; nothing was written; retry shortly")

    def _member_count(self) -> int:
        return len(self._peers.all())

    def leader_term(self) -> int:
        """The current term, checking that this node leads it."""
        self.ensure_leader()
        return self._replicator.status().term

    def submit(self, command: internal_pb2.Command | bytes | CommandPieces, *, sync: bool = False) -> object:
        """Replicate ``command`` (a message, or one serialized already, whole or in pieces); return the state machine's
        result once applied here.

        ``sync=True`` (``fsync`` topics): acknowledged only once a majority has fsynced it."""
        self.ensure_leader()
        waiter = _Waiter()
        self._replicator.submit(_serialized(command), waiter, sync=sync)
        if not waiter.done.wait(self._timeout_s):
            raise self._not_committed()
        return self._outcome(waiter.result, waiter.error)

    async def submit_async(self, command: internal_pb2.Command | bytes | CommandPieces, *, sync: bool = False,
                           leader_checked: bool = False) -> object:
        """:meth:`submit` for a coroutine on an event loop: the same checks, bound, errors and
        messages, and no thread waits. The replicator's callback (its thread) hands the outcome to
        the loop with ``call_soon_threadsafe``; a caller cancelled meanwhile (client gone, or the
        bound passed) leaves nothing that raises later: a late outcome for a finished future is
        dropped, and so is one that finds the loop closed (the server stopped).

        ``leader_checked``: the caller ran :meth:`ensure_leader` in this same step of the loop (no
        ``await`` since), so it is not run again. The bound is one timer on the loop, not
        ``asyncio.wait_for`` (a waiter future and callbacks of its own: ~6 us more per call, warm)."""
        if not leader_checked:
            self.ensure_leader()
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[tuple[object, ReplicationError | None]] = loop.create_future()

        def settle(result: object, error: ReplicationError | None) -> None:  # on the loop
            if not outcome.done():
                outcome.set_result((result, error))

        def callback(result: object, error: ReplicationError | None) -> None:  # replication thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, result, error)

        self._replicator.submit(_serialized(command), callback, sync=sync)
        bound = loop.call_later(self._timeout_s, _expire, outcome)
        try:
            result, error = await outcome
        except _Expired:
            raise self._not_committed() from None
        finally:
            bound.cancel()
        return self._outcome(result, error)

    def _not_committed(self) -> Unavailable:
        return Unavailable(f"not committed within {self._timeout_s:g} s (quorum lost or overloaded); "
                           "the write may or may not be applied")

    def _outcome(self, result: object, error: ReplicationError | None) -> object:
        if error is not None:
            raise self._map(error)
        return result

    def _map(self, error: ReplicationError) -> Exception:
        reason = error.reason
        if reason == FailReason.NOT_LEADER:
            hinted = self._peers.by_raft(str(error))  # the leader, or the target of a hand-over
            return NotLeader(hinted.grpc_address if hinted else self.leader_grpc_address())
        if reason == FailReason.QUEUE_FULL:
            return ResourceExhausted("the replication queue is full; retry with back-off")
        if reason == FailReason.TOO_LARGE:
            return InvalidArgument(f"command too large for replication: {error}")
        if reason == FailReason.DISCARDED:
            return Unavailable("leadership changed before the write committed; it was not applied")
        return Unavailable(f"replication failed ({reason.value}): {error}")
