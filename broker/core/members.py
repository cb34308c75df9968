"""The replicated registry of the cluster's members (``member_change`` commands, Command field 39).

Raft knows members by their Raft address; clients need gRPC addresses. Members added at run time
are stored in ``Column.META`` under ``member/<node id>`` -> ``Member``, applied on every node;
:class:`broker.leader.membership.MembershipChanges` (leader only) submits the changes and
``broker.leader.submitter.PeerDirectory`` consults the registry.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.core.applied import CacheChanges, Rejected
from broker.core.errors import InvalidArgument
from broker.core.state_machine import BrokerStateMachine
from broker.storage import Batch, Column
from broker.v1 import internal_pb2

KEY_PREFIX = b"member/"
_KEY_END = b"member0"  # b"/" + 1


@dataclass(frozen=True)
class Peer:
    """A cluster member as configured: Raft and gRPC addresses."""

    node_id: str
    raft_address: str
    grpc_address: str
    metrics_address: str = ""



class MemberRegistry:
    """The replicated ``node id -> (Raft, gRPC address)`` registry; reads are from the local store."""

    def __init__(self, state: BrokerStateMachine) -> None:
        self._state = state
        self._cache: tuple[int, dict[str, Peer]] | None = None
        state.register("member_change", self._apply)  # before anything is applied

    def _apply(self, cmd: internal_pb2.MemberChangeCommand, batch: Batch, changes: CacheChanges) -> object:
        member = cmd.member
        if not member.node_id:
            return Rejected(InvalidArgument("a member needs a node id"))
        key = KEY_PREFIX + member.node_id.encode()
        if cmd.remove:
            batch.delete(Column.META, key)
        else:
            batch.put(Column.META, key, member.SerializeToString())
        return None

    def members(self) -> dict[str, Peer]:
        """Registered members by node id (cached until the next apply or restore)."""
        applied = self._state.applied_index()
        cached = self._cache
        if cached is not None and cached[0] == applied:
            return cached[1]
        found: dict[str, Peer] = {}
        for _key, value in self._state.store.scan(Column.META, KEY_PREFIX, _KEY_END):
            m = internal_pb2.Member.FromString(value)
            found[m.node_id] = Peer(m.node_id, m.raft_address, m.grpc_address)
        self._cache = (applied, found)
        return found

    def by_raft(self, raft_address: str) -> Peer | None:
        return next((p for p in self.members().values() if p.raft_address == raft_address), None)
