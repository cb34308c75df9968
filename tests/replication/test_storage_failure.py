"""A storage failure while applying halts the node for good (it cannot know what it wrote), instead
of being retried on every tick or skipped (issue 11, item 2: "stop the node loudly")."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.replication import Role
from broker.replication.raft import PysyncobjReplicator
from broker.storage import StorageFailure

from .chain_sm import ChainStateMachine
from .cluster import free_port, wait_until
from .conftest import FAST_OPTIONS, Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class DyingDisk(ChainStateMachine):
    """The chain state machine over a disk that fails on the command ``b"disk-gone"``."""

    def apply(self, index: int, command: bytes | memoryview) -> object:
        if command == b"disk-gone":
            raise StorageFailure("write failed: I/O error")
        return super().apply(index, command)


def test_a_storage_failure_during_apply_halts_the_node(tmp_path: Path) -> None:
    directory = tmp_path
    sm = DyingDisk(directory / "sm")
    rep = PysyncobjReplicator(f"127.0.0.1:{free_port()}", [], directory / "raft", sm, FAST_OPTIONS)
    try:
        rep.start()
        wait_until(lambda: rep.status().role == Role.LEADER, 10, "single-node election")
        outcomes = Outcomes()
        rep.submit(b"fine", outcomes.callback(0))
        wait_until(lambda: 0 in outcomes.results, 10, "the first command")
        applied = rep.status().applied_index
        rep.submit(b"disk-gone", outcomes.callback(1))
        wait_until(lambda: rep.status().role != Role.LEADER, 10, "the node to halt")
        assert rep.status().applied_index == applied and not rep.status().has_quorum
        # reported as halted, with why (raftbroker_raft_halted and the RaftbrokerNodeHalted alert read it)
        assert rep.status().halted_reason == "StorageFailure: write failed: I/O error"
        rep.submit(b"after", outcomes.callback(2))
        wait_until(lambda: 2 in outcomes.results, 10, "a refusal")
        assert outcomes.results[2][1] is not None  # a halted node accepts nothing
    finally:
        rep.close()
        sm.close()
