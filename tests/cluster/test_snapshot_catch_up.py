"""A follower that lost its whole data directory rejoins and is caught up through a snapshot; one that
was only away is caught up from the leader's journal, entries read back from its segments."""

from __future__ import annotations

import os
import shutil
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.client import Client
from broker.devcluster import DevCluster
from tests.cluster.digests import digest, partition_contents, wait_converged
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


@contextmanager
def three_nodes(tmp_path: Path, **env: str) -> Iterator[tuple[DevCluster, int, int]]:
    """A 3-node cluster with ``env`` set, its leader and the follower a test sends away; stopped after."""
    c = DevCluster(3, tmp_path, env=dict(os.environ, **env)).start()
    try:
        leader = c.addresses.index(c.wait_ready(60))
        yield c, leader, (leader + 1) % 3
    finally:
        c.stop()


def assert_replicas_identical(c: DevCluster, topic: str, leader: int, records_per_partition: int) -> None:
    for p in range(2):
        contents = [partition_contents(c.grpc_address(i), topic, p) for i in range(3)]
        assert len(contents[leader]) == records_per_partition
        assert len({digest(x) for x in contents}) == 1, f"replicas differ on partition {p}"


def test_wiped_follower_catches_up_through_a_snapshot(tmp_path: Path) -> None:
    # The leader compacts at 4x the threshold times its spread factor (up to 1.5): at most 120 entries
    # here, so it surely drops the prefix the wiped follower needs while 120 batches arrive.
    with three_nodes(tmp_path, RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES="20") as (c, leader, follower):
        with Client(c.addresses) as client:
            client.create_topic("snap", partitions=2)
            for b in range(120):
                client.publish_batch("snap", [{"value": b"%d-%d" % (b, i), "partition": b % 2} for i in range(20)])
            c.kill(follower)
            shutil.rmtree(c.node_data_dir(follower))
            for b in range(120, 240):  # the leader keeps compacting while the follower is away
                client.publish_batch("snap", [{"value": b"%d-%d" % (b, i), "partition": b % 2} for i in range(20)])
        c.spawn(follower)
        wait_until(lambda: "restored snapshot" in c.log_path(follower).read_text(), 60,
                   "the wiped follower to restore a snapshot")
        wait_converged(c)
        assert_replicas_identical(c, "snap", leader, 120 * 20)


def read_back_entries(c: DevCluster, i: int) -> float:
    text = urllib.request.urlopen(f"http://{c.metrics_address(i)}/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "raftbroker_raft_journal_read_back_entries_total":
                return float(sample.value)
    raise AssertionError("raftbroker_raft_journal_read_back_entries_total is not exported")


def test_a_follower_that_was_away_is_caught_up_from_entries_read_back_from_the_journal(tmp_path: Path) -> None:
    """The journal holds only its newest 1 MiB of commands in memory here; the follower misses ~3 MiB
    of them and no compaction drops them (20,000 entries by default), so the leader sends them read
    back from its segments, and the replicas end identical."""
    with three_nodes(tmp_path, RAFTBROKER_RAFT_JOURNAL_CACHE_BYTES=str(1 << 20)) as (c, leader, follower):
        with Client(c.addresses) as client:
            client.create_topic("away", partitions=2)
            for b in range(10):
                client.publish_batch("away", [{"value": os.urandom(1024), "partition": b % 2} for _ in range(30)])
            c.kill(follower)
            for b in range(10, 110):  # ~3 MiB of commands while the follower is away
                client.publish_batch("away", [{"value": os.urandom(1024), "partition": b % 2} for _ in range(30)])
            others = [i for i in range(3) if i != follower]  # the leader, or the other one if it took over
            before = sum(read_back_entries(c, i) for i in others)
        c.spawn(follower)
        wait_converged(c)
        assert "restored snapshot" not in c.log_path(follower).read_text()
        assert sum(read_back_entries(c, i) for i in others) - before >= 50  # sent from the segments
        assert_replicas_identical(c, "away", leader, 110 * 30 // 2)
