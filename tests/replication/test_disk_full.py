"""A full disk (docs/operations.md, "A full disk"): the node halts loudly, and everything that reads
its state says so. A store write that fails while applying halts the node; health, and the node's
reads (``Node.require_serving``), must refuse on that halt as on a failed journal write, or a reader
on that node is served its stale store as if it were the end of the log (seen in the walk: a reader
on a follower halted by ENOSPC got 47,600 of 73,600 acknowledged records and a clean end)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.replication import Role
from broker.replication.raft import PysyncobjReplicator
from broker.services.health import replica_health
from broker.storage import StorageFailure

from .chain_sm import ChainStateMachine
from .cluster import free_port, wait_until
from .conftest import FAST_OPTIONS, Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

ENOSPC = "write failed: IO error: No space left on device: While pwrite to file at offset 0: /data/store/000014.sst"


class FullDisk(ChainStateMachine):
    """The chain state machine whose store write fails as RocksDB's does on a full disk."""

    def apply(self, index: int, command: bytes | memoryview) -> object:
        if command == b"fill":
            raise StorageFailure(ENOSPC)
        return super().apply(index, command)


def test_an_apply_halted_by_a_full_disk_is_the_replicators_failure(tmp_path: Path) -> None:
    sm = FullDisk(tmp_path / "sm")
    rep = PysyncobjReplicator(f"127.0.0.1:{free_port()}", [], tmp_path / "raft", sm, FAST_OPTIONS)
    try:
        rep.start()
        wait_until(lambda: rep.status().role == Role.LEADER, 10, "single-node election")
        outcomes = Outcomes()
        rep.submit(b"fine", outcomes.callback(0))
        wait_until(lambda: 0 in outcomes.results, 10, "the first command")
        assert rep.failure is None and replica_health(rep) == (True, "")
        rep.submit(b"fill", outcomes.callback(1))
        wait_until(lambda: rep.status().halted_reason is not None, 10, "the node to halt")
        # what Node.require_serving refuses reads on, and what health reports
        assert isinstance(rep.failure, StorageFailure) and "No space left on device" in str(rep.failure)
        serving, why = replica_health(rep)
        assert not serving and why == f"Raft halted: {ENOSPC}", why
    finally:
        rep.close()
        sm.close()
