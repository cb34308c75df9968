"""The pysyncobj patches: pinned to the source they change, and each one shown to matter.

Every ``check_*`` function below states a property; the ``patched`` test proves it holds with the
patch on and the ``stock`` test proves the same check fails with that one patch switched off.
Multi-process checks of the same patches are in test_cluster.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pysyncobj.syncobj as pysyncobj_syncobj
import pytest

from broker.replication import _patches, raft

from .chain_sm import ChainStateMachine
from .cluster import free_port
from .conftest import Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

NO_OP = b"\x01"  # pysyncobj's NO_OP command type: never reaches the state machine
LEADER_STATE = 2  # pysyncobj's _RAFT_STATE.LEADER


# --- pins -----------------------------------------------------------------------------------------

def test_all_patches_are_on_by_default() -> None:
    assert _patches.active_patches() == frozenset(_patches.PATCH_NAMES)
    assert _patches.pickle_protocol() == 5


def test_a_changed_method_source_fails_loudly() -> None:
    wrong_sha = dataclasses.replace(_patches._APPEND_ENTRIES, source_sha256="0" * 64)
    original = _patches._ORIGINALS["append_entries"]
    with pytest.raises(_patches.PysyncobjPatchError, match="written against pysyncobj 0.3.17"):
        _patches._build(wrong_sha, original)


def test_a_replacement_that_does_not_match_exactly_once_fails_loudly() -> None:
    missing = dataclasses.replace(_patches._LARGE_COMMAND, replacements=(("no such text", "x"),))
    with pytest.raises(_patches.PysyncobjPatchError, match="expected 1 match"):
        _patches._build(missing, _patches._ORIGINALS["large_command"])


def test_unknown_patch_names_in_the_environment_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown patch names"):
        _patches.patches_off_from_env({_patches.ENV_PATCHES_OFF: "pickle5,typo"})
    assert _patches.patches_off_from_env({_patches.ENV_PATCHES_OFF: " pickle5 , "}) == {"pickle5"}


def test_switching_patches_off_and_on_restores_the_exact_functions(restore_patches: None) -> None:
    # _RaftNode overrides the handler (PreVote) and calls SyncObj's, which the patch replaces.
    base = pysyncobj_syncobj.SyncObj
    on = base._SyncObj__onMessageReceived
    _patches.apply_patches(append_entries=False)
    assert base._SyncObj__onMessageReceived is _patches._ORIGINALS["append_entries"]
    _patches.apply_patches()
    assert base._SyncObj__onMessageReceived is on
    assert _patches.active_patches() == frozenset(_patches.PATCH_NAMES)


def test_behaviours_are_switched_like_patches(restore_patches: None) -> None:
    _patches.apply_patches(prevote=False, journal_sync=False)
    assert _patches.active_patches() == frozenset(_patches.PATCH_NAMES) - {"prevote", "journal_sync"}
    assert _patches.patches_off_from_env({_patches.ENV_PATCHES_OFF: "prevote"}) == {"prevote"}


# --- (a) pickle protocol 5 ------------------------------------------------------------------------

def check_command_is_stored_and_sent_at_its_own_size(single_node: Callable[..., Any]) -> None:
    """A 100 KB random bytes command becomes a log entry (the bytes on the wire) of ~1.0x its size."""
    rep, _ = single_node()
    command = os.urandom(100_000)
    outcomes = Outcomes()
    rep.submit(command, outcomes.callback(0))
    outcomes.wait(1)
    result, error = outcomes.results[0]
    assert error is None and isinstance(result, dict)
    size = rep.log_entry_size_bytes(result["index"])
    assert size is not None
    ratio = size / len(command)
    assert 1.0 <= ratio < 1.01, f"entry is {ratio:.3f}x the command"


def test_pickle5_patched(single_node: Callable[..., Any]) -> None:
    check_command_is_stored_and_sent_at_its_own_size(single_node)


def test_pickle5_stock_bloats_bytes_by_half(single_node: Callable[..., Any], restore_patches: None) -> None:
    _patches.apply_patches(pickle5=False)
    with pytest.raises(AssertionError, match=r"entry is 1\.[45]\d*x"):
        check_command_is_stored_and_sent_at_its_own_size(single_node)


# --- (c) AppendEntries, driven message by message on a node that never ticks ----------------------

class RecordingNode(raft._RaftNode):
    """Records the replies a follower sends instead of sending them."""

    def __init__(self, *args: Any) -> None:
        self.replies: list[tuple[int | None, bool, bool]] = []
        super().__init__(*args)

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False, nextNodeIdx: int | None = None,
                                  success: bool = False) -> None:
        self.replies.append((nextNodeIdx, success, reset))


@pytest.fixture
def quiet_node(tmp_path: Path) -> Iterator[RecordingNode]:
    """A follower with two (unreachable) peers and no tick thread: only the test moves it."""
    sm = ChainStateMachine(tmp_path / "sm")
    conf = raft.RaftOptions().to_conf(tmp_path / "journal", tmp_path / "dump", lambda f, d: None,
                                      lambda f: ())
    conf.autoTick = False
    peers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    node = RecordingNode(f"127.0.0.1:{free_port()}", peers, conf, sm, 1 << 30)
    yield node
    node.destroy()
    sm.close()


def leader_of(node: RecordingNode) -> Any:
    return sorted(node.otherNodes, key=lambda n: n.id)[0]


def append_entries(node: RecordingNode, term: int, prev: tuple[int, int], entries: list[tuple[int, int]],
                   commit: int) -> None:
    node._SyncObj__onMessageReceived(leader_of(node), {
        "type": "append_entries", "term": term, "commit_index": commit,
        "entries": [(NO_OP, index, entry_term) for index, entry_term in entries],
        "prevLogIdx": prev[0], "prevLogTerm": prev[1],
    })


def log_of(node: RecordingNode) -> list[tuple[int, int]]:
    raft_log = node._SyncObj__raftLog
    return [(raft_log[i][1], raft_log[i][2]) for i in range(len(raft_log))]


def check_follower_keeps_acknowledged_entries(node: RecordingNode) -> None:
    """A heartbeat for an older prefix (the leader's next index lagging a pipelined reply) must not
    delete entries the follower already acknowledged: Raft deletes only on a term conflict."""
    append_entries(node, 1, (1, 0), [(2, 1), (3, 1), (4, 1), (5, 1)], commit=1)
    assert node.replies[-1] == (6, True, False)
    append_entries(node, 1, (3, 1), [], commit=1)
    assert node.replies[-1] == (4, True, False)
    append_entries(node, 1, (2, 1), [(3, 1)], commit=1)  # a resent, already held entry
    assert log_of(node) == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)], "acknowledged entries were deleted"


def test_append_entries_patched_follower_keeps_acknowledged_entries(quiet_node: RecordingNode) -> None:
    check_follower_keeps_acknowledged_entries(quiet_node)


def test_append_entries_stock_follower_deletes_acknowledged_entries(
        quiet_node: RecordingNode, restore_patches: None) -> None:
    _patches.apply_patches(append_entries=False)
    with pytest.raises(AssertionError, match="acknowledged entries were deleted"):
        check_follower_keeps_acknowledged_entries(quiet_node)


def test_follower_replaces_entries_from_the_first_term_conflict(quiet_node: RecordingNode) -> None:
    append_entries(quiet_node, 1, (1, 0), [(2, 1), (3, 1), (4, 1), (5, 1)], commit=1)
    append_entries(quiet_node, 2, (2, 1), [(3, 1), (4, 2)], commit=1)
    assert log_of(quiet_node) == [(1, 0), (2, 1), (3, 1), (4, 2)]
    assert quiet_node.replies[-1] == (5, True, False)


def test_follower_commits_only_what_the_message_proved(quiet_node: RecordingNode) -> None:
    """Entries past the last one a message covered may be a stale tail from an old term."""
    append_entries(quiet_node, 1, (1, 0), [(2, 1), (3, 1), (4, 1), (5, 1)], commit=1)
    append_entries(quiet_node, 2, (2, 1), [], commit=5)  # new leader: its 3..5 may differ
    assert quiet_node.raftCommitIndex == 2
    append_entries(quiet_node, 2, (3, 1), [(4, 2)], commit=5)
    assert quiet_node.raftCommitIndex == 4 and log_of(quiet_node)[-1] == (4, 2)


def check_leader_next_index_ignores_stale_replies(node: RecordingNode) -> None:
    """Success replies never move a follower's next index back; resets never move it forward."""
    peer = leader_of(node)
    node._SyncObj__raftState = LEADER_STATE
    node._SyncObj__raftNextIndex[peer] = 31  # optimistic: 11..20 and 21..30 in flight
    node._SyncObj__raftMatchIndex[peer] = 0
    node._SyncObj__lastResponseTime[peer] = 0
    reply = {"type": "next_node_idx", "next_node_idx": 21, "success": True, "reset": False}
    node._SyncObj__onMessageReceived(peer, reply)
    assert node._SyncObj__raftMatchIndex[peer] == 20
    assert node._SyncObj__raftNextIndex[peer] == 31, "a success reply moved the next index back"
    node._SyncObj__onMessageReceived(peer, {**reply, "next_node_idx": 15, "success": False, "reset": True})
    node._SyncObj__onMessageReceived(peer, {**reply, "next_node_idx": 26, "success": False, "reset": True})
    assert node._SyncObj__raftNextIndex[peer] == 15, "a later reset moved the next index forward"


def test_append_entries_patched_leader_keeps_next_index(quiet_node: RecordingNode) -> None:
    check_leader_next_index_ignores_stale_replies(quiet_node)


def test_append_entries_stock_leader_moves_next_index_back(
        quiet_node: RecordingNode, restore_patches: None) -> None:
    _patches.apply_patches(append_entries=False)
    with pytest.raises(AssertionError, match="moved the next index back"):
        check_leader_next_index_ignores_stale_replies(quiet_node)
