"""The member registry (replicated addresses of members added at run time), the peer directory
that consults it, and the checks of AddNode/RemoveNode before anything is replicated."""

from __future__ import annotations

import pytest

from broker.core.errors import InvalidArgument, MemberNotFound, Unavailable
from broker.core.members import MemberRegistry, Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.membership import MembershipChanges
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.replication.memory import InMemoryReplicator
from broker.storage.memory import MemoryStore
from broker.v1 import internal_pb2

pytestmark = pytest.mark.unit

ME = Peer("n1", "memory:0", "127.0.0.1:7001")


def node(store: MemoryStore) -> tuple[MemberRegistry, PeerDirectory, MembershipChanges, CommandSubmitter]:
    state = BrokerStateMachine(store, Changes())
    registry = MemberRegistry(state)
    replicator = InMemoryReplicator(state)
    replicator.start()
    peers = PeerDirectory([ME])
    peers.attach(registry, replicator.members)
    submitter = CommandSubmitter(replicator, peers, 5.0)
    return registry, peers, MembershipChanges(registry, replicator, replicator, submitter, peers, 5.0), submitter


def change(submitter: CommandSubmitter, node_id: str, raft: str = "", grpc: str = "", remove: bool = False) -> None:
    member = internal_pb2.Member(node_id=node_id, raft_address=raft, grpc_address=grpc)
    submitter.submit(internal_pb2.Command(member_change=internal_pb2.MemberChangeCommand(member=member, remove=remove)))


def test_registered_members_are_replicated_state_that_survives_a_reload() -> None:
    store = MemoryStore()
    registry, peers, _, submitter = node(store)
    change(submitter, "n4", "10.0.0.4:7101", "10.0.0.4:7001")
    change(submitter, "n5", "10.0.0.5:7101", "10.0.0.5:7001")
    change(submitter, "n5", remove=True)
    assert registry.members() == {"n4": Peer("n4", "10.0.0.4:7101", "10.0.0.4:7001")}
    assert peers.by_raft("10.0.0.4:7101") == Peer("n4", "10.0.0.4:7101", "10.0.0.4:7001")
    assert peers.by_id("n1") == ME and peers.by_raft("memory:0") == ME  # configured members
    again, _, _, _ = node(store)  # a restart reads the store
    assert set(again.members()) == {"n4"}


def test_the_directory_lists_the_current_configuration() -> None:
    registry, peers, _, submitter = node(MemoryStore())
    change(submitter, "n4", "10.0.0.4:7101", "10.0.0.4:7001")
    assert peers.all() == [ME]  # n4 is registered but not (yet) in the Raft configuration
    current = ["memory:0", "10.0.0.4:7101", "10.0.0.9:7101"]
    peers.attach(registry, lambda: current)
    assert [p.node_id for p in peers.all()] == ["n1", "n4", "10.0.0.9:7101"]  # unknown: named by address


@pytest.mark.parametrize("node_id, raft, grpc, match", [
    ("", "h:1", "h:2", "node id"),
    ("bad id", "h:1", "h:2", "node id"),
    ("n4", "no-port", "h:2", "raft_address"),
    ("n4", "h:1", "h:99999", "grpc_address"),
])
def test_add_checks_its_arguments(node_id: str, raft: str, grpc: str, match: str) -> None:
    _, _, changes, _ = node(MemoryStore())
    with pytest.raises(InvalidArgument, match=match):
        changes.add(node_id, raft, grpc)


def test_a_refused_change_is_reported_and_unknown_members_are_not_found() -> None:
    registry, _, changes, _ = node(MemoryStore())
    with pytest.raises(Unavailable, match="add n4 failed"):
        changes.add("n4", "10.0.0.4:7101", "10.0.0.4:7001")  # the in-memory replicator has no network
    assert "n4" in registry.members()  # addresses first; a retry completes the change
    with pytest.raises(MemberNotFound, match="'n9'"):
        changes.remove("n9")
    with pytest.raises(Unavailable, match="cannot remove itself"):
        changes.remove("n1")  # the leader, with nobody to hand over to
