"""PreVote, message by message, on nodes without a tick thread (the test drives every tick)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.monotonic import monotonic
from pysyncobj.transport import TCPTransport

from broker.replication import raft

from .chain_sm import ChainStateMachine
from .cluster import free_port
from .test_journal import FakeConnection

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

NO_OP = b"\x01"
LEADER_STATE = 2


class Wire:
    """What the nodes sent, as (destination id, message)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def of_type(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        return [(to, m) for to, m in self.sent if m.get("type") == kind]


@pytest.fixture
def make_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Callable[..., Any], Wire]]:
    """Followers with two connected (fake) peers; every message they send is recorded."""
    wire = Wire()

    def record(transport: Any, node: Any, message: Any) -> bool:
        wire.sent.append((node.id, message))
        return True

    monkeypatch.setattr(TCPTransport, "send", record)
    built: list[tuple[Any, ChainStateMachine]] = []

    def make(pre_vote: bool = True) -> Any:
        directory = tmp_path / f"node{len(built)}"
        sm = ChainStateMachine(directory / "sm")
        conf = raft.RaftOptions().to_conf(directory / "raft.wal", directory / "dump", lambda f, d: None,
                                          lambda f: ())
        conf.autoTick = False
        peers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
        node = raft._RaftNode(f"127.0.0.1:{free_port()}", peers, conf, sm, 1 << 30, pre_vote=pre_vote)
        for peer in node.otherNodes:
            node._SyncObj__transport._connections[peer] = FakeConnection()
            node._SyncObj__connectedNodes.add(peer)
        built.append((node, sm))
        return node

    yield make, wire
    for node, sm in built:
        node.destroy()
        sm.close()


def peers(node: Any) -> list[Any]:
    return sorted(node.otherNodes, key=lambda n: n.id)


def expire(node: Any) -> None:
    """Let the election deadline pass and run one tick."""
    node._SyncObj__raftElectionDeadline = 0
    node._onTick(0)
    node.release_held_messages()


def heartbeat(node: Any, sender: Any, term: int) -> None:
    node._SyncObj__onMessageReceived(sender, {"type": "append_entries", "term": term, "commit_index": 1,
                                              "prevLogIdx": 1, "prevLogTerm": 0, "entries": []})


def test_an_expired_deadline_asks_for_pre_votes_without_raising_the_term(make_node: Any) -> None:
    make, wire = make_node
    node = make()
    term = node.raftCurrentTerm
    expire(node)
    assert node.raftCurrentTerm == term and node._SyncObj__raftState == 0
    asked = wire.of_type("pre_vote")
    assert sorted(to for to, _ in asked) == [p.id for p in peers(node)]
    assert {m["term"] for _, m in asked} == {term + 1} and not wire.of_type("request_vote")
    assert node._SyncObj__raftElectionDeadline > monotonic()  # no new round before the next timeout


def test_one_grant_of_two_peers_is_a_majority_and_the_real_election_follows(make_node: Any) -> None:
    make, wire = make_node
    node = make()
    term = node.raftCurrentTerm
    expire(node)
    node._SyncObj__onMessageReceived(peers(node)[0], {"type": "pre_vote_resp", "term": term + 1, "granted": True})
    node._onTick(0)  # the grant set the deadline to now: the gate opens
    node.release_held_messages()
    assert node.raftCurrentTerm == term + 1 and node._SyncObj__raftState == 1  # candidate
    assert len(wire.of_type("request_vote")) == 2


def test_denials_and_stale_grants_start_nothing(make_node: Any) -> None:
    make, wire = make_node
    node = make()
    term = node.raftCurrentTerm
    expire(node)
    first, second = peers(node)
    node._SyncObj__onMessageReceived(first, {"type": "pre_vote_resp", "term": term + 1, "granted": False})
    node._SyncObj__onMessageReceived(second, {"type": "pre_vote_resp", "term": term + 7, "granted": True})
    node._onTick(0)
    assert node.raftCurrentTerm == term and not wire.of_type("request_vote")


def pre_vote(node: Any, sender: Any, term: int, last: tuple[int, int]) -> bool:
    """Deliver a pre-vote request; return whether the node granted it."""
    node._SyncObj__onMessageReceived(sender, {"type": "pre_vote", "term": term, "last_log_index": last[0],
                                              "last_log_term": last[1]})
    node.release_held_messages()
    return bool(node._test_wire.of_type("pre_vote_resp")[-1][1]["granted"])


def test_grant_rules(make_node: Any) -> None:
    make, wire = make_node
    node = make()
    node._test_wire = wire
    sender = peers(node)[0]
    term = node.raftCurrentTerm
    assert pre_vote(node, sender, term + 1, (1, 0))  # no leader heard, log as long: granted
    assert not pre_vote(node, sender, term, (1, 0))  # the term would not rise
    assert not pre_vote(node, sender, term + 1, (0, 0))  # the candidate's log is shorter
    heartbeat(node, peers(node)[1], term)
    assert not pre_vote(node, sender, term + 1, (5, 9))  # a leader was heard just now
    node._last_leader_contact = monotonic() - 1.0
    assert pre_vote(node, sender, term + 1, (5, 9))  # not for longer than the lease
    node._SyncObj__raftState = LEADER_STATE
    assert not pre_vote(node, sender, term + 1, (5, 9))  # a leader never grants
    assert node.raftCurrentTerm == term  # granting changes nothing


def test_a_leader_heartbeat_cancels_the_round(make_node: Any) -> None:
    make, wire = make_node
    node = make()
    term = node.raftCurrentTerm
    expire(node)
    heartbeat(node, peers(node)[1], term)
    node._SyncObj__onMessageReceived(peers(node)[0], {"type": "pre_vote_resp", "term": term + 1, "granted": True})
    node._onTick(0)
    assert node.raftCurrentTerm == term and not wire.of_type("request_vote")


def test_a_node_above_the_leaders_term_falls_back_to_one_real_election(make_node: Any) -> None:
    make, wire = make_node
    node = make()
    node._SyncObj__setCurrentTerm(5, None)  # e.g. a failed election raised it
    heartbeat(node, peers(node)[0], 3)  # the live leader's term is lower: pysyncobj drops it
    expire(node)
    assert node.raftCurrentTerm == 6 and len(wire.of_type("request_vote")) == 2
    assert not wire.of_type("pre_vote")


def test_leadership_transfer_skips_the_pre_vote(make_node: Any) -> None:
    make, wire = make_node
    node = make()
    leader = peers(node)[0]
    heartbeat(node, leader, 0)
    node._SyncObj__onMessageReceived(leader, {"type": "timeout_now", "term": node.raftCurrentTerm})
    node._onTick(0)
    node.release_held_messages()
    assert len(wire.of_type("request_vote")) == 2 and not wire.of_type("pre_vote")


def test_without_prevote_an_expired_deadline_raises_the_term_at_once(make_node: Any) -> None:
    make, wire = make_node
    node = make(pre_vote=False)
    term = node.raftCurrentTerm
    expire(node)
    assert node.raftCurrentTerm == term + 1 and len(wire.of_type("request_vote")) == 2
