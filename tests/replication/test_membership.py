"""Membership after a restart: a node uses the latest configuration in its log, applied or not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pytest
from pysyncobj.node import TCPNode

from broker.replication import raft
from broker.replication.journal import JOURNAL_DIR_NAME, DurableJournal

from .chain_sm import ChainStateMachine
from .cluster import free_port

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

NO_OP = b"\x01"
MEMBERSHIP = b"\x02"


def membership(kind: str, address: str) -> bytes:
    node = TCPNode(address)
    return MEMBERSHIP + pysyncobj_pickle.dumps([kind, node.id, node])


@pytest.fixture
def restarted(tmp_path: Path) -> Iterator[Callable[[list[bytes]], Any]]:
    """A follower (no tick thread) whose journal already holds ``commands`` after the first no-op,
    none of them applied: as after a restart."""
    built: list[tuple[Any, ChainStateMachine]] = []

    def make(commands: list[bytes]) -> Any:
        journal = DurableJournal(tmp_path / JOURNAL_DIR_NAME, needs_sync=lambda command: True)
        journal.add(NO_OP, 1, 0)
        for index, command in enumerate(commands, start=2):
            journal.add(command, index, 1)
        journal._destroy()
        sm = ChainStateMachine(tmp_path / "sm")
        conf = raft.RaftOptions().to_conf(tmp_path / "raft.wal", tmp_path / "dump", lambda f, d: None,
                                          lambda f: ())
        conf.autoTick = False
        peers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
        node = raft._RaftNode(f"127.0.0.1:{free_port()}", peers, conf, sm, 1 << 30)
        built.append((node, sm))
        return node

    yield make
    for node, sm in built:
        node.destroy()
        sm.close()


def test_a_restarted_node_counts_in_the_configuration_its_log_ends_with(restarted: Any) -> None:
    added, removed = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    node = restarted([membership("add", added), membership("add", removed), membership("rem", removed)])
    assert len(node.otherNodes) == 2  # what it was started with (pysyncobj would keep it until applied)
    node._onTick(0)
    ids = {n.id for n in node.otherNodes}
    assert added in ids and removed not in ids and len(ids) == 3
    node._SyncObj__raftCommitIndex = 4  # applying the entries later changes nothing more
    node._onTick(0)
    assert len(node.otherNodes) == 3


def test_stock_pysyncobj_would_start_from_the_older_configuration(restarted: Any) -> None:
    node = restarted([membership("add", f"127.0.0.1:{free_port()}")])
    node._configuration_replayed = True  # what pysyncobj alone does
    node._onTick(0)
    assert len(node.otherNodes) == 2
