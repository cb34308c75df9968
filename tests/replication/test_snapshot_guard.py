"""Stale snapshots and stale replies (snapshot_guard): driven message by message on nodes that never
tick, so each reproduction is deterministic. Every ``check_*`` holds with the behaviour on and fails
with ``stale_snapshot`` switched off (stock pysyncobj)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.replication import _patches, raft
from broker.replication.snapshot import pack, read_raft_data

from .chain_sm import ChainStateMachine
from .cluster import free_port
from .test_patches import LEADER_STATE, NO_OP, RecordingNode, append_entries, leader_of, log_of

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def make_node(directory: Path) -> tuple[RecordingNode, ChainStateMachine]:
    """A follower with two unreachable peers whose snapshots carry only raftData (no state machine)."""
    sm = ChainStateMachine(directory / "sm")
    conf = raft.RaftOptions().to_conf(directory / "journal", directory / "dump", lambda f, d: None,
                                      read_raft_data)
    conf.autoTick = False
    peers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    return RecordingNode(f"127.0.0.1:{free_port()}", peers, conf, sm, 1 << 30), sm


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Any]:
    """Builds quiet nodes (after the test chose its patches); destroyed at teardown."""
    built: list[tuple[RecordingNode, ChainStateMachine]] = []

    def make() -> RecordingNode:
        built.append(make_node(tmp_path / f"node{len(built)}"))
        return built[-1][0]

    yield make
    for node, sm in built:
        node.destroy()
        sm.close()


def send_snapshot(node: RecordingNode, scratch: Path, term: int, last: tuple[int, int], commit: int) -> None:
    """Stream a snapshot ending at entry ``last`` = (index, term) to ``node`` in two chunks."""
    scratch.mkdir(parents=True, exist_ok=True)
    state = scratch / "state"
    state.mkdir(exist_ok=True)
    target = scratch / "snapshot.tar"
    members = node.otherNodes | {node.selfNode}
    pack(state, ((NO_OP, last[0], last[1]), (NO_OP, last[0] - 1, last[1]), members), target)
    data = target.read_bytes()
    half = len(data) // 2
    for chunk, first, final in ((data[:half], True, False), (data[half:], False, True)):
        node._SyncObj__onMessageReceived(leader_of(node), {
            "type": "append_entries", "term": term, "commit_index": commit, "serialized": (chunk, first, final),
        })


def check_follower_keeps_entries_past_a_stale_snapshot(node: RecordingNode, scratch: Path) -> None:
    """Entries 2..10 are acknowledged and committed (10 with this follower's acknowledgement); a
    snapshot at 5 that arrives late (after a stale reset reply) must not take 6..10 away."""
    append_entries(node, 1, (1, 0), [(index, 1) for index in range(2, 11)], commit=10)
    assert node.raftCommitIndex == 10 and node.replies[-1] == (11, True, False)
    send_snapshot(node, scratch, 1, (5, 1), commit=10)
    assert log_of(node)[-1] == (10, 1), f"the follower dropped committed entries: log is now {log_of(node)}"
    assert node.raftCommitIndex == 10
    assert node.replies[-1] == (11, True, False), "the reply must say the follower matches up to 10"


def test_stale_snapshot_guarded_follower_keeps_committed_entries(nodes: Any, tmp_path: Path) -> None:
    node = nodes()
    check_follower_keeps_entries_past_a_stale_snapshot(node, tmp_path / "snap")
    assert node.stale_snapshots_refused == 1
    assert not Path(str(node.conf.fullDumpFile) + ".incoming").exists()


def test_stale_snapshot_stock_follower_drops_committed_entries(
        nodes: Any, tmp_path: Path, restore_patches: None) -> None:
    _patches.apply_patches(stale_snapshot=False)
    with pytest.raises(AssertionError, match="dropped committed entries"):
        check_follower_keeps_entries_past_a_stale_snapshot(nodes(), tmp_path / "snap")


def test_a_held_last_entry_keeps_the_uncommitted_tail_too(nodes: Any, tmp_path: Path) -> None:
    """Rule 6: the log holds the snapshot's last entry with the same term: keep what follows."""
    node = nodes()
    append_entries(node, 1, (1, 0), [(index, 1) for index in range(2, 9)], commit=3)
    send_snapshot(node, tmp_path / "snap", 1, (6, 1), commit=6)
    assert log_of(node)[-1] == (8, 1) and node.replies[-1] == (7, True, False)


def test_a_snapshot_past_the_log_or_conflicting_with_it_is_installed(nodes: Any, tmp_path: Path) -> None:
    ahead = nodes()
    append_entries(ahead, 1, (1, 0), [(2, 1), (3, 1)], commit=3)
    send_snapshot(ahead, tmp_path / "ahead", 1, (6, 1), commit=6)
    assert log_of(ahead) == [(5, 1), (6, 1)] and ahead.raftLastApplied == 6
    assert ahead.replies[-1] == (None, True, False) and ahead.raftCommitIndex == 6  # None: log end + 1

    conflicting = nodes()  # holds 6 from term 1 uncommitted; the snapshot's 6 is from term 2
    append_entries(conflicting, 1, (1, 0), [(index, 1) for index in range(2, 9)], commit=3)
    send_snapshot(conflicting, tmp_path / "conflict", 2, (6, 2), commit=6)
    assert log_of(conflicting) == [(5, 2), (6, 2)] and conflicting.stale_snapshots_refused == 0


def check_leader_drops_a_delayed_reset(node: RecordingNode) -> None:
    """Requests 1..3 were sent with an optimistic next index; the follower answered 1 with a reset
    to 21, the leader resent from 21 (request 4), then the delayed reset answering request 2 (to 11,
    below the leader's compacted prefix: it would stream a stale snapshot) arrives."""
    peer = leader_of(node)
    node._SyncObj__raftState = LEADER_STATE
    node._SyncObj__raftNextIndex[peer] = 41
    node._SyncObj__raftMatchIndex[peer] = 0
    node._SyncObj__lastResponseTime[peer] = 0
    request = {"type": "append_entries", "term": 0, "commit_index": 0, "entries": []}
    for _ in range(3):
        node.stamp_outgoing(peer, dict(request))
    reset = {"type": "next_node_idx", "success": False, "reset": True, "term": node.raftCurrentTerm}
    node._SyncObj__onMessageReceived(peer, {**reset, "next_node_idx": 21, "rb_seq": 1})
    assert node._SyncObj__raftNextIndex[peer] == 21
    node.stamp_outgoing(peer, dict(request))  # request 4, from 21
    node._SyncObj__onMessageReceived(peer, {**reset, "next_node_idx": 11, "rb_seq": 2})
    assert node._SyncObj__raftNextIndex[peer] == 21, "a delayed reset moved the next index back"
    node._SyncObj__onMessageReceived(peer, {**reset, "next_node_idx": 19, "rb_seq": 4})  # a fresh one
    assert node._SyncObj__raftNextIndex[peer] == 19


def test_stale_snapshot_guarded_leader_drops_a_delayed_reset(nodes: Any) -> None:
    node = nodes()
    check_leader_drops_a_delayed_reset(node)
    assert node.stale_replies_dropped == 1


def test_stale_snapshot_stock_leader_follows_a_delayed_reset(nodes: Any, restore_patches: None) -> None:
    _patches.apply_patches(stale_snapshot=False)
    with pytest.raises(AssertionError, match="delayed reset moved the next index back"):
        check_leader_drops_a_delayed_reset(nodes())


def test_a_reply_from_an_older_term_is_dropped(nodes: Any) -> None:
    node = nodes()
    peer = leader_of(node)
    node._SyncObj__raftCurrentTerm = 3
    node._SyncObj__raftState = LEADER_STATE
    node._SyncObj__raftNextIndex[peer] = 41
    node._SyncObj__raftMatchIndex[peer] = 0
    node._SyncObj__lastResponseTime[peer] = 0
    node._SyncObj__onMessageReceived(peer, {"type": "next_node_idx", "success": True, "reset": False,
                                            "next_node_idx": 30, "term": 2})
    assert node._SyncObj__raftMatchIndex[peer] == 0


def test_replies_echo_the_request_sequence_and_the_term(nodes: Any) -> None:
    node = nodes()
    node._replying_to_seq = 7
    reply = {"type": "next_node_idx", "next_node_idx": 3, "reset": False, "success": True}
    node.stamp_outgoing(leader_of(node), reply)
    assert reply["rb_seq"] == 7 and reply["term"] == node.raftCurrentTerm
