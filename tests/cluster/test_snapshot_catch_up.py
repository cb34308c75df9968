"""A follower that lost its whole data directory rejoins and is caught up through a snapshot."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from broker.client import Client
from broker.devcluster import DevCluster
from tests.cluster.digests import digest, partition_contents, wait_converged
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def test_wiped_follower_catches_up_through_a_snapshot(tmp_path: Path) -> None:
    # The leader compacts at 4x the threshold times its spread factor (up to 1.5): at most 120 entries
    # here, so it surely drops the prefix the wiped follower needs while 120 batches arrive.
    env = dict(os.environ, RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES="20")
    c = DevCluster(3, tmp_path, env=env).start()
    try:
        leader = c.addresses.index(c.wait_ready(60))
        follower = (leader + 1) % 3
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
        for p in range(2):
            contents = [partition_contents(c.grpc_address(i), "snap", p) for i in range(3)]
            assert len(contents[leader]) == 120 * 20
            assert len({digest(x) for x in contents}) == 1, f"replicas differ on partition {p}"
    finally:
        c.stop()
