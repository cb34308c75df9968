"""The membership drill as a loop (issue 12 item 1): a follower is removed, wiped and re-added several
times while a writer publishes, catching up through the leader's snapshot each time. No node's
journal may fall below its commit index (pysyncobj logs "exceeds journal end" when it clamps one),
no node truncates applied entries, every replica ends the same and nothing acknowledged is lost."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from broker.client import Client
from broker.devcluster import DevCluster
from tests.cluster.digests import digest, partition_contents, wait_converged
from tests.cluster.test_membership import TOPIC, Publisher, caught_up, members
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(400)]

ROUNDS = 8
BAD_LINES = ("exceeds journal end", "truncating already-applied")


class IndexWatch:
    """Polls every running node's status: a node's commit index must never go back while it runs."""

    def __init__(self, c: DevCluster) -> None:
        self.c = c
        self.last: dict[int, int] = {}
        self.regressions: list[tuple[int, int, int]] = []
        self._lives: dict[int, int] = {}  # bumped by forget: a status fetched before it is dropped
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def forget(self, i: int) -> None:
        """Node ``i`` is wiped: its indexes start again from 0. A status the watch fetched from the
        node's previous process (the fetch may be under way now) is not compared with the new one's."""
        with self._lock:
            self._lives[i] = self._lives.get(i, 0) + 1
            self.last.pop(i, None)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for i in range(self.c.nodes):
                with self._lock:
                    life = self._lives.get(i, 0)
                status = self.c.node_status(i, timeout_s=0.5) if self.c.alive(i) else None
                if status is None or not status.commit_index:
                    continue
                with self._lock:
                    if self._lives.get(i, 0) != life:
                        continue
                    before = self.last.get(i, 0)
                    if status.commit_index < before:
                        self.regressions.append((i, before, status.commit_index))
                    self.last[i] = max(before, status.commit_index)

    def __enter__(self) -> IndexWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_follower_removed_wiped_and_readded_in_a_loop_keeps_every_journal_whole(tmp_path: Path) -> None:
    env = dict(os.environ, RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES="30")  # snapshots every few hundred entries
    c = DevCluster(3, tmp_path, env=env).start()
    try:
        c.wait_ready(60)
        with Client(c.addresses, retry_deadline_s=60) as client:
            client.create_topic(TOPIC)
            with Publisher(client) as publisher, IndexWatch(c) as watch:
                publisher.wait_for_more(2000)
                for round_ in range(ROUNDS):
                    leader = c.leader()
                    assert leader is not None
                    target = [i for i in range(3) if i != leader][round_ % 2]
                    name = c.node_id(target)
                    client.remove_node(name)

                    def removed(t: int = target, n: str = name) -> bool:
                        return (lead := c.leader()) is not None and lead != t and n not in members(c, lead)

                    wait_until(removed, 60, f"{name} out of the configuration")
                    c.kill(target)
                    watch.forget(target)
                    shutil.rmtree(c.node_data_dir(target))
                    c.spawn(target)
                    c.wait_answering(target)  # a leader adds only a node that answers
                    client.add_node(name, c.raft_address(target), c.grpc_address(target))

                    def rejoined(t: int = target) -> bool:
                        return caught_up(c, t)

                    wait_until(rejoined, 90, f"{name} to catch up")
                    publisher.wait_for_more(300)
            assert publisher.error is None, publisher.error
        assert not watch.regressions, f"commit indexes went back: {watch.regressions[:5]}"
        wait_converged(c)
        for i in range(3):
            log = c.log_path(i).read_text(errors="replace")
            for bad in BAD_LINES:
                assert bad not in log, f"{c.node_id(i)} logged {bad!r}"
        contents = [partition_contents(c.grpc_address(i), TOPIC, 0) for i in range(3)]
        assert len({digest(x) for x in contents}) == 1, "replicas differ"
        stored = {v for _, v in contents[0]}
        missing = [v for v in publisher.acked if v not in stored]
        assert not missing, f"{len(missing)} acknowledged records lost"
        restored = sum(c.log_path(i).read_text(errors="replace").count("restored state machine from snapshot")
                       for i in range(3))
        refused = sum(c.log_path(i).read_text(errors="replace").count("refused a snapshot") for i in range(3))
        print(f"{ROUNDS} removals and re-adds: {len(publisher.acked)} records acknowledged, "
              f"{restored} snapshot restores, {refused} stale snapshots refused")
        assert restored >= ROUNDS, "the re-added nodes did not catch up through snapshots"
    finally:
        c.stop()
