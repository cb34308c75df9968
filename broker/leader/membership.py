"""Adding or removing a cluster member (leader only); the registry of their addresses is
:mod:`broker.core.members`.

Raft knows members by their Raft address; clients need gRPC addresses (followers answer writes
with the leader's in ``x-leader``). A node knows the members it was started with (``--peer``);
members added later are in this registry, which every node holds: ``member_change`` commands
(Command field 39) stored in ``Column.META`` under ``member/<node id>``. ``PeerDirectory`` consults
it (see ``broker.leader.submitter``).

``Membership.add`` (leader only) records the new member's addresses first, so that every node can
name it before it can lead, then asks the replicator to add its Raft address; ``remove`` asks the
replicator first, then forgets the addresses. Each waits for its commits. pysyncobj changes one
member at a time and uses a new configuration as soon as it is appended: the new node counts in
the majority at once, so start it first (with the current members as ``--peer``); it catches up
from the leader's snapshot and log.

A node that is not running would count in the majority all the same: added to one node, it would
stop every commit until it started, and to three it would leave no room for a failure. So ``add``
first asks the new node's gRPC address for its status (``NodeStatus``, which needs no credentials),
for up to :data:`ANSWER_WAIT_S` (a node spawned a moment ago is still starting), and refuses with
``FAILED_PRECONDITION`` when nothing answers there, or when what answers is another node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from broker.config import ID_RE, ID_RULE
from broker.core.applied import Rejected
from broker.core.errors import (
    FailedPrecondition,
    InvalidArgument,
    MemberExists,
    MemberNotFound,
    NotLeader,
    Unavailable,
    shown,
)
from broker.core.members import MemberRegistry, Peer
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.replication import FailReason, Membership, ReplicationError, Replicator, Role
from broker.v1 import internal_pb2

_TRANSFER_WAIT_S = 2.0
ANSWER_WAIT_S = 5.0  # how long ``add`` waits at most for the new node to answer at its gRPC address
_ANSWER_POLL_S = 0.2



@dataclass(frozen=True)
class NodeAnswer:
    """What a node said of itself when asked at a gRPC address."""

    node_id: str
    raft_address: str  # empty when the node did not say


NodeProbe = Callable[[Peer], NodeAnswer | None]  # None: nothing answered at the peer's gRPC address


def check_address(what: str, address: str) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"{what} must be host:port with a port in 1..65535, got {shown(address)}")


class _Outcome:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: ReplicationError | None = None

    def __call__(self, result: object, error: ReplicationError | None) -> None:
        self.error = error
        self.done.set()


class MembershipChanges:
    """Leader-side AddNode/RemoveNode: validate, record addresses, change the Raft group, wait."""

    def __init__(self, registry: MemberRegistry, replicator: Replicator, membership: Membership,
                 submitter: CommandSubmitter, peers: PeerDirectory, timeout_s: float, probe: NodeProbe,
                 answer_wait_s: float = ANSWER_WAIT_S) -> None:
        """``probe``: asks a node at its gRPC address for its own status (see the module docstring)."""
        self._probe = probe
        self._answer_wait_s = answer_wait_s
        self._registry = registry
        self._replicator = membership
        self._status = replicator
        self._submitter = submitter
        self._peers = peers
        self._timeout_s = timeout_s
        self._lock = threading.Lock()  # one change at a time from this node

    def add(self, node_id: str, raft_address: str, grpc_address: str, answer_wait_s: float | None = None) -> None:
        """Make the running node ``node_id`` a member; idempotent for the same addresses.
        ``answer_wait_s``: wait less than the configured time for it to answer (the caller's deadline)."""
        if not ID_RE.fullmatch(node_id):
            raise InvalidArgument(f"node id must be {ID_RULE}, got {shown(node_id)}")
        check_address("raft_address", raft_address)
        check_address("grpc_address", grpc_address)
        with self._lock:
            self._submitter.ensure_leader()
            members = self._replicator.members()
            known = self._peers.by_id(node_id)
            if known is not None and known.raft_address != raft_address and known.raft_address in members:
                raise MemberExists(f"node id {node_id!r} is a member with Raft address {known.raft_address}")
            owner = self._peers.by_raft(raft_address)
            if owner is not None and owner.node_id != node_id and raft_address in members:
                raise MemberExists(f"Raft address {raft_address} belongs to member {owner.node_id!r}")
            if raft_address in members and known is not None and known.grpc_address == grpc_address:
                return  # already done (a retried request)
            if raft_address not in members:
                wait_s = self._answer_wait_s if answer_wait_s is None else min(self._answer_wait_s, answer_wait_s)
                self._check_running(Peer(node_id, raft_address, grpc_address), wait_s)
            member = internal_pb2.Member(node_id=node_id, raft_address=raft_address, grpc_address=grpc_address)
            self._record(member, remove=False)
            if raft_address not in members:
                self._change(self._replicator.add_member, raft_address, f"add {node_id}")

    def _check_running(self, peer: Peer, wait_s: float) -> None:
        """Refuse a node that does not answer at its gRPC address within ``wait_s``, or answers as
        another node."""
        deadline = time.monotonic() + wait_s
        while (info := self._probe(peer)) is None and time.monotonic() < deadline:
            time.sleep(_ANSWER_POLL_S)
        if info is None:
            raise FailedPrecondition(
                f"node {peer.node_id!r} does not answer at {peer.grpc_address} (waited {wait_s:.3g} s): "
                "start it first, with the current members as --peer, then add it (a member that is not running "
                "counts in the majority all the same)")
        if info.node_id != peer.node_id:
            raise FailedPrecondition(f"{peer.grpc_address} answers as node {info.node_id!r}, not {peer.node_id!r}: "
                                     "check the address or the node's --node-id")
        if info.raft_address and info.raft_address != peer.raft_address:
            raise FailedPrecondition(f"node {peer.node_id!r} listens for Raft on {info.raft_address}, not "
                                     f"{peer.raft_address}: add it with the address it was started with")

    def remove(self, node_id: str) -> None:
        """Take ``node_id`` out of the Raft group (a leader hands leadership over first)."""
        with self._lock:
            self._submitter.ensure_leader()
            peer = self._peers.by_id(node_id)
            members = self._replicator.members()
            if peer is None or peer.raft_address not in members:
                raise MemberNotFound(node_id)
            if peer.raft_address == members[0]:  # this node, the leader: let another lead, then retry
                self._hand_over()
            if len(members) <= 1:
                raise InvalidArgument("the last member cannot be removed")
            self._change(self._replicator.remove_member, peer.raft_address, f"remove {node_id}")
            if self._registry.members().get(node_id) is not None:
                self._record(internal_pb2.Member(node_id=node_id), remove=True)

    def _record(self, member: internal_pb2.Member, remove: bool) -> None:
        cmd = internal_pb2.Command(member_change=internal_pb2.MemberChangeCommand(member=member, remove=remove))
        result = self._submitter.submit(cmd, sync=True)  # configuration: always durable
        if isinstance(result, Rejected):
            raise result.error

    def _change(self, change: Any, raft_address: str, what: str) -> None:
        outcome = _Outcome()
        change(raft_address, outcome)
        if not outcome.done.wait(self._timeout_s):
            raise Unavailable(f"{what}: not committed within {self._timeout_s:g} s; check cluster status and retry")
        error = outcome.error
        if error is None:
            return
        if error.reason in (FailReason.NOT_LEADER, FailReason.NO_LEADER):
            raise NotLeader(self._submitter.leader_grpc_address())
        raise Unavailable(f"{what} failed ({error.reason.value}): {error}")

    def _hand_over(self) -> NoReturn:
        """The leader cannot remove itself: hand leadership over and send the caller to the new one."""
        if self._status.transfer_leadership():
            deadline = time.monotonic() + _TRANSFER_WAIT_S
            while time.monotonic() < deadline and self._status.status().role == Role.LEADER:
                time.sleep(0.02)
        if self._status.status().role != Role.LEADER:
            raise NotLeader(self._submitter.leader_grpc_address())
        raise Unavailable("the leader cannot remove itself and no follower is caught up to take over; retry")
