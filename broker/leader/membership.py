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
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, NoReturn

from broker.core.applied import Rejected
from broker.core.errors import InvalidArgument, MemberExists, MemberNotFound, NotLeader, Unavailable, shown
from broker.core.members import MemberRegistry
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.replication import FailReason, Membership, ReplicationError, Replicator, Role
from broker.v1 import internal_pb2

_NODE_ID = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_TRANSFER_WAIT_S = 2.0


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
                 submitter: CommandSubmitter, peers: PeerDirectory, timeout_s: float) -> None:
        self._registry = registry
        self._replicator = membership
        self._status = replicator
        self._submitter = submitter
        self._peers = peers
        self._timeout_s = timeout_s
        self._lock = threading.Lock()  # one change at a time from this node

    def add(self, node_id: str, raft_address: str, grpc_address: str) -> None:
        """Make the running node ``node_id`` a member; idempotent for the same addresses."""
        if not _NODE_ID.fullmatch(node_id):
            raise InvalidArgument("node id must be 1-64 of A-Z a-z 0-9 . _ - (starting alphanumeric), "
                                  f"got {shown(node_id)}")
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
            member = internal_pb2.Member(node_id=node_id, raft_address=raft_address, grpc_address=grpc_address)
            self._record(member, remove=False)
            if raft_address not in members:
                self._change(self._replicator.add_member, raft_address, f"add {node_id}")

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
