"""The member registry (replicated addresses of members added at run time), the peer directory
that consults it, and the checks of AddNode/RemoveNode before anything is replicated."""

from __future__ import annotations

import pytest

from broker.core.errors import FailedPrecondition, InvalidArgument, MemberNotFound, Unavailable
from broker.core.members import MemberRegistry, Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.membership import MembershipChanges, NodeAnswer, NodeProbe
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.replication.memory import InMemoryReplicator
from broker.storage.memory import MemoryStore
from broker.v1 import internal_pb2

pytestmark = pytest.mark.unit

ME = Peer("n1", "memory:0", "127.0.0.1:7001")


def running(peer: Peer) -> NodeAnswer | None:
    """Every node asked is running and is who it is said to be."""
    return NodeAnswer(peer.node_id, peer.raft_address)


def node(store: MemoryStore, probe: NodeProbe = running,
         ) -> tuple[MemberRegistry, PeerDirectory, MembershipChanges, CommandSubmitter]:
    state = BrokerStateMachine(store, Changes())
    registry = MemberRegistry(state)
    replicator = InMemoryReplicator(state)
    replicator.start()
    peers = PeerDirectory([ME])
    peers.attach(registry, replicator.members)
    submitter = CommandSubmitter(replicator, peers, 5.0)
    changes = MembershipChanges(registry, replicator, replicator, submitter, peers, 5.0, probe, answer_wait_s=0.3)
    return registry, peers, changes, submitter


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


@pytest.mark.parametrize("answer, match", [
    (None, r"node 'n4' does not answer at 10.0.0.4:7001 \(waited 0.3 s\): start it first"),
    (NodeAnswer("n7", "10.0.0.4:7101"), "10.0.0.4:7001 answers as node 'n7', not 'n4'"),
    (NodeAnswer("n4", "10.0.0.4:7999"), "listens for Raft on 10.0.0.4:7999, not 10.0.0.4:7101"),
])
def test_a_node_that_does_not_answer_or_is_another_is_not_added(answer: NodeAnswer | None, match: str) -> None:
    """A member that is not running would count in the majority all the same; nothing is changed."""
    asked: list[Peer] = []

    def probe(peer: Peer) -> NodeAnswer | None:
        asked.append(peer)
        return answer

    registry, _, changes, _ = node(MemoryStore(), probe)
    with pytest.raises(FailedPrecondition, match=match):
        changes.add("n4", "10.0.0.4:7101", "10.0.0.4:7001")
    assert "n4" not in registry.members()
    assert asked[0] == Peer("n4", "10.0.0.4:7101", "10.0.0.4:7001")
    assert len(asked) > 1 if answer is None else len(asked) == 1, "a silent node is asked until the wait ends"


def test_a_node_that_answers_after_a_while_is_added() -> None:
    """A node spawned a moment ago is still starting: the leader asks again until it answers."""
    answers: list[NodeAnswer | None] = [None, None, NodeAnswer("n4", "10.0.0.4:7101")]
    registry, _, changes, _ = node(MemoryStore(), lambda peer: answers.pop(0))
    with pytest.raises(Unavailable, match="add n4 failed"):  # past the check: the in-memory replicator's refusal
        changes.add("n4", "10.0.0.4:7101", "10.0.0.4:7001")
    assert not answers and "n4" in registry.members()
