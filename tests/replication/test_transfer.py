"""Leadership transfer that holds writes (transfer.LeadershipTransferMixin), driven step by step on a
node that never ticks: writes are refused naming the target from the start, TimeoutNow leaves only
once the target holds the whole log, and writes resume when the transfer runs out of time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import FAIL_REASON

from broker.replication import raft

from .chain_sm import ChainStateMachine
from .cluster import free_port
from .test_patches import LEADER_STATE, NO_OP, leader_of

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class SendingNode(raft._RaftNode):
    """Records what it sends instead of sending it."""

    def __init__(self, *args: Any) -> None:
        self.sent: list[tuple[Any, dict[str, Any]]] = []
        super().__init__(*args)


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[SendingNode]:
    """A leader of three whose log ends at 3 and whose peer ``leader_of(node)`` has matched 2."""
    sm = ChainStateMachine(tmp_path / "sm")
    conf = raft.RaftOptions().to_conf(tmp_path / "journal", tmp_path / "dump", lambda f, d: None, lambda f: ())
    conf.autoTick = False
    peers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    node = SendingNode(f"127.0.0.1:{free_port()}", peers, conf, sm, 1 << 30)
    node._SyncObj__transport.send = lambda peer, message: node.sent.append((peer, message))
    for index in (2, 3):
        node._SyncObj__raftLog.add(NO_OP, index, 1)
    node._SyncObj__raftCurrentTerm = 1
    node._SyncObj__raftState = LEADER_STATE
    node._SyncObj__raftLeader = node._SyncObj__selfNode
    for peer in node.otherNodes:
        node._SyncObj__connectedNodes.add(peer)
        node._SyncObj__raftMatchIndex[peer] = 1
        node._SyncObj__raftNextIndex[peer] = 4
    node._SyncObj__raftMatchIndex[leader_of(node)] = 2
    yield node
    node.destroy()
    sm.close()


def queued_outcome(node: SendingNode) -> int:
    outcomes: list[int] = []
    node._SyncObj__commandsQueue.put_nowait((b"cmd", lambda _result, code: outcomes.append(code)))
    node._checkCommandsToApply()
    assert len(outcomes) == 1
    return outcomes[0]


def timeouts_sent(node: SendingNode) -> list[Any]:
    return [peer for peer, message in node.sent if message.get("type") == "timeout_now"]


def test_writes_are_held_from_the_start_and_timeout_now_waits_for_the_target(leader: SendingNode) -> None:
    target = leader_of(leader)
    assert leader.begin_transfer(None, 5.0), "the most caught-up connected peer is the target"
    assert leader.transfer_target_address == str(target.id)
    assert queued_outcome(leader) == FAIL_REASON.NOT_LEADER
    assert timeouts_sent(leader) == [], "the target does not hold the whole log yet"
    leader._SyncObj__raftMatchIndex[target] = 3
    leader._advance_transfer()
    leader._advance_transfer()
    assert timeouts_sent(leader) == [target], "TimeoutNow once the target caught up, and only once"


def test_writes_resume_when_the_transfer_runs_out_of_time(leader: SendingNode) -> None:
    assert leader.begin_transfer(None, 0.05)
    time.sleep(0.1)  # the transfer's own deadline, not a wait for state
    leader._advance_transfer()
    assert not leader.transferring and leader.transfer_target_address is None
    assert leader.transfers_timed_out == 1
    leader._SyncObj__commandsQueue.put_nowait((b"cmd", lambda _result, _code: None))
    leader._checkCommandsToApply()
    assert leader._SyncObj__getCurrentLogIndex() == 4, "the command was appended again"


def test_losing_leadership_ends_the_transfer(leader: SendingNode) -> None:
    assert leader.begin_transfer(None, 5.0)
    leader._SyncObj__raftState = 0
    leader._advance_transfer()
    assert not leader.transferring


def test_no_connected_peer_or_not_leading_means_no_transfer(leader: SendingNode) -> None:
    assert not leader.begin_transfer("127.0.0.1:1", 5.0), "not a member"
    leader._SyncObj__connectedNodes.clear()
    assert not leader.begin_transfer(None, 5.0)
    leader._SyncObj__raftState = 0
    assert not leader.begin_transfer(None, 5.0)
