"""Fixtures for the replication tests: process clusters (killed by PID at teardown), in-process
single nodes, and a guard that restores the pysyncobj patches after a test switched some off."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.replication import ReplicationError, _patches
from broker.replication.raft import PysyncobjReplicator, RaftOptions

from .chain_sm import ChainStateMachine
from .cluster import Cluster, free_port, wait_until

# Fast single-node elections for in-process tests (same relations as the defaults).
FAST_OPTIONS = RaftOptions(raft_min_timeout_s=0.16, raft_max_timeout_s=0.3)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Build and start 3-node process clusters; every process is SIGKILLed by PID at teardown."""
    clusters: list[Cluster] = []

    def make(**kwargs: Any) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(clusters)}", **kwargs)
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        cluster.kill_all()


@pytest.fixture
def restore_patches() -> Iterator[None]:
    """Let a test call ``apply_patches`` with some switched off; restore the default set after."""
    yield
    _patches.apply_patches_from_env()


class Outcomes:
    """Collects submit callbacks; each callback must be called exactly once."""

    def __init__(self) -> None:
        self.results: dict[int, tuple[object, ReplicationError | None]] = {}
        self._lock = threading.Lock()
        self.duplicates = 0

    def callback(self, key: int) -> Callable[[object, ReplicationError | None], None]:
        def done(result: object, error: ReplicationError | None) -> None:
            with self._lock:
                if key in self.results:
                    self.duplicates += 1
                self.results[key] = (result, error)
        return done

    def index(self, key: int) -> int:
        """The log index a successful submit ``key`` reported (ChainStateMachine's result)."""
        result, _ = self.results[key]
        assert isinstance(result, dict), result
        return int(result["index"])

    def wait(self, count: int, timeout_s: float = 10.0) -> None:
        wait_until(lambda: len(self.results) >= count, timeout_s, f"{count} callbacks")


@pytest.fixture
def single_node(tmp_path: Path) -> Iterator[Callable[..., tuple[PysyncobjReplicator, ChainStateMachine]]]:
    """Start in-process single-node (or lone-member) PysyncobjReplicators; closed at teardown."""
    started: list[tuple[PysyncobjReplicator, ChainStateMachine]] = []

    def make(options: RaftOptions = FAST_OPTIONS, peers: int = 0,
             wait_leader: bool = True) -> tuple[PysyncobjReplicator, ChainStateMachine]:
        directory = tmp_path / f"node{len(started)}"
        sm = ChainStateMachine(directory / "sm")
        address = f"127.0.0.1:{free_port()}"
        others = [f"127.0.0.1:{free_port()}" for _ in range(peers)]
        rep = PysyncobjReplicator(address, others, directory / "raft", sm, options)
        started.append((rep, sm))
        rep.start()
        if wait_leader:
            wait_until(lambda: rep.status().role == "leader", 5, "single-node election")
        return rep, sm

    yield make
    for rep, sm in started:
        rep.close()
        sm.close()
