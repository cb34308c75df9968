"""Replication seam: what the core needs from a consensus log, and what it gives back.

The core hands opaque ``bytes`` commands (or their :class:`CommandPieces`) to a :class:`Replicator`;
once a majority has committed one, every node calls :meth:`StateMachine.apply` with it, in log order.

Only modules of this package import pysyncobj (tests/unit/test_import_rules.py checks it): the
Raft node and its options (``raft``, ``raft_node``), the patches and pins of its internals
(``_patches``, ``transport``, ``journal``), pre-vote and leadership transfer (``prevote``,
``transfer``) and the chaos drills' dial redirection (``dial``). This module itself does not: the
rest of the broker sees only these protocols.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class StateMachine(Protocol):
    """The deterministic state a Raft log drives.

    ``apply`` must produce the same state on every node for the same (index, command) sequence,
    must skip any index at or below :meth:`applied_index` (re-applies after restarts and resent
    ranges), and must record the index atomically with the data it writes.
    """

    def apply(self, index: int, command: bytes | memoryview) -> object:
        """Apply one committed command; the return value is handed to the submitter's callback.
        ``command`` is the bytes submitted, or a read-only view of them inside the log entry (a large
        command, not copied out: parse it, hash it or copy it, as with bytes)."""
        ...

    def applied_index(self) -> int:
        """The highest Raft index whose effects are in the store (0 when empty)."""
        ...

    def journal_opened(self, last_index: int) -> None:
        """Called once by a replicator that keeps a journal, before its first apply: ``last_index``
        is the highest index the journal held when this process opened it (0: none).

        Commands up to it were in the log before this start, so their applies are replays (or the
        first applies of entries received before a crash): the state machine applies them as usual
        but keeps none of their effects that a restart must lose (records of `memory` topics)."""
        ...

    def journal_truncated(self, from_index: int) -> None:
        """The replicator's journal dropped its entries from ``from_index`` on (a new leader's log
        replaced entries this node held uncommitted): commands applied at those indexes later are
        new ones, not replays of what :meth:`journal_opened` counted."""
        ...

    def discard_state(self) -> None:
        """Drop the whole state: back to empty, applied index 0. A replicator calls it at start, before
        :meth:`journal_opened`, when the state is ahead of every index its journal and snapshot still
        hold: a power loss dropped journal entries whose applies the state had already made durable
        (they may never have been fsynced by anyone, and a new leader may put other commands at
        those indexes, which an apply would skip). The state is rebuilt from the snapshot and the
        journal, or from the leader."""
        ...

    def write_snapshot(self, directory: str) -> None:
        """Write a consistent copy of the whole state into ``directory`` (which must not exist)."""
        ...

    def restore_snapshot(self, directory: str, index: int) -> None:
        """Replace the whole state with the snapshot in ``directory`` taken at Raft ``index``.

        A state machine already at or past ``index`` may keep its own state.
        """
        ...


class Role(enum.StrEnum):
    LEADER = "leader"
    FOLLOWER = "follower"
    CANDIDATE = "candidate"


class FailReason(enum.StrEnum):
    """Why a submitted command was not applied."""

    NOT_LEADER = "not_leader"  # this node is not the leader; the command was not appended
    NO_LEADER = "no_leader"  # no leader is known (election in progress or no quorum)
    QUEUE_FULL = "queue_full"  # back-pressure: the submit queue is full
    DISCARDED = "discarded"  # appended but overwritten by a new leader: not applied
    TIMEOUT = "timeout"  # no outcome within the caller's bound: outcome unknown
    TOO_LARGE = "too_large"  # command above the replicator's size limit


class ReplicationError(Exception):
    """A command that was not (or not knowably) applied."""

    def __init__(self, reason: FailReason, message: str = "") -> None:
        super().__init__(message or reason.value)
        self.reason = reason


class ReplicaDataDamaged(Exception):
    """This node's own replication data (its Raft journal) is damaged where it was made durable: the
    node refuses to start rather than guess (the lost part may hold a vote). The message names the file
    and what to do: move the node's data directory away and let it catch up from the leader."""


@dataclass(frozen=True)
class ReplicaStatus:
    """One node's view of the Raft group."""

    self_address: str
    role: Role
    term: int
    commit_index: int
    applied_index: int
    leader_address: str | None
    has_quorum: bool
    halted_reason: str | None = None  # set when Raft stopped for good on this node (why); it serves nothing
    # As leader: it has applied the first entry of its own term, so its state machine holds every entry
    # committed before it was elected (Raft's leader completeness, as the state machine sees it). A
    # node elected with committed entries it has not applied yet (after a whole-cluster restart, its
    # commit index known only once its term's entry commits) must not answer or validate from its
    # state until then: a topic created earlier would look missing. True on every other role.
    leader_ready: bool = True


Callback = Callable[[object, ReplicationError | None], None]


@dataclass(frozen=True, slots=True)
class CommandPieces:
    """A command given as the pieces it is built from, in order: the command is ``b"".join(pieces)``.
    A replicator that wraps each command in a log entry of its own format joins the pieces once,
    straight into the entry, instead of the command being joined first and then copied into the
    entry (a 1 MiB publish is one copy, not two, on the leader). ``size`` is the command's length."""

    pieces: list[bytes]
    size: int

    @classmethod
    def of(cls, pieces: list[bytes]) -> CommandPieces:
        return cls(pieces, sum(map(len, pieces)))

    def joined(self) -> bytes:
        return b"".join(self.pieces)


def command_size(command: bytes | CommandPieces) -> int:
    return command.size if isinstance(command, CommandPieces) else len(command)


class Replicator(Protocol):
    """A consensus log that feeds a :class:`StateMachine`."""

    def start(self) -> None:
        """Open the journal and snapshot, join the cluster and start ticking (non-blocking)."""
        ...

    def submit(self, command: bytes | CommandPieces, callback: Callback, *, sync: bool = False) -> None:
        """Append ``command`` (its bytes, or its pieces) on the leader; ``callback(result, None)``
        runs after it is applied locally, ``callback(None, error)`` when it will not be. Never
        blocks; callbacks run on the replication thread and must not block either.

        ``sync=True`` (the ``fsync`` durability class): success also means that a majority has
        fsynced the entry. Otherwise it is written (surviving a process crash) but may be only in
        the OS page cache when acknowledged."""
        ...

    def status(self) -> ReplicaStatus:
        """A point-in-time view; safe from any thread."""
        ...

    def transfer_leadership(self, target_address: str | None = None) -> bool:
        """Ask to hand leadership to ``target_address`` (or any caught-up node)."""
        ...

    def force_compaction(self) -> None:
        """Take a snapshot and drop the covered log prefix as soon as possible."""
        ...

    def close(self) -> None:
        """Stop ticking and release files and sockets."""
        ...


class Membership(Protocol):
    """The optional power to change the Raft group's members, one node at a time."""

    def members(self) -> list[str]:
        """Raft addresses of the current configuration, this node first (as of the last tick)."""
        ...

    def add_member(self, raft_address: str, callback: Callback) -> None:
        """On the leader: append a configuration that adds ``raft_address``; ``callback(None, None)``
        once it is committed. The new node should already run, with the members as its peers."""
        ...

    def remove_member(self, raft_address: str, callback: Callback) -> None:
        """On the leader: append a configuration without ``raft_address`` (never the leader itself)."""
        ...
