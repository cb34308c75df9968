"""Backup and restore (docs/deploy.md, "Back up and restore"), followed step by step against a real cluster
whose follower's copy holds a Raft snapshot and a membership change (both name the old members: a
restore that counted them never had a majority): a caught-up follower is stopped gracefully (the other
two keep serving), its data directory is copied, and it is started again; the copy is restored into a
fresh single node (new id, new addresses, no peers, adopting the copy: without --adopt-data-dir the
start is refused, the copy being recorded as the follower's), which becomes its own leader and serves
exactly the records that were acknowledged before the backup, in every partition, and accepts new
writes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.client import Client, Record
from broker.data_dir import RESTORING_FILE
from broker.devcluster import METRICS_PORT_OFFSET, RAFT_PORT_OFFSET, DevCluster, free_base_port
from broker.replication.raft import DUMP_FILE_NAME
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

TOPICS = {"orders": 3, "audit": 1}
RECORDS_PER_TOPIC = 90


def contents(client: Client) -> dict[str, list[tuple[int, int, bytes]]]:
    return {t: sorted((r.partition, r.offset, r.value) for r in client.subscribe(t, stop_at_end=True)
                      if isinstance(r, Record)) for t in TOPICS}


def test_backup_of_a_follower_restores_into_a_single_node(tmp_path: Path) -> None:
    # snapshots every 30 entries: a copy of a long-running node holds one, which names the old
    # members (a restore that counted them never had a majority)
    cluster = DevCluster(3, tmp_path / "cluster", env={**os.environ, "RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES": "30",
                                                       "RAFTBROKER_RAFT_COMPACTION_MIN_TIME_S": "2"})
    restored: subprocess.Popen[bytes] | None = None
    try:
        cluster.start()
        cluster.wait_ready(60)
        with Client(cluster.addresses) as client:
            for topic, partitions in TOPICS.items():
                client.create_topic(topic, partitions=partitions)
                for k in range(RECORDS_PER_TOPIC):
                    client.publish(topic, f"{topic}-{k}".encode(), key=f"k{k}")
            before = contents(client)
            assert sum(len(v) for v in before.values()) == len(TOPICS) * RECORDS_PER_TOPIC
            # and a membership change in its history: a fourth member
            fourth = cluster.add_node()
            client.add_node(cluster.node_id(fourth), cluster.raft_address(fourth), cluster.grpc_address(fourth))

            # 1. a follower that has applied everything the leader committed
            status = client.cluster_status()
            leader = status.leader
            assert leader is not None
            follower = next(i for i in range(3) if cluster.node_id(i) != leader.id)
            def caught_up() -> bool:
                s = client.cluster_status()
                return s.leader is not None and any(
                    n.id == cluster.node_id(follower) and n.applied_index >= s.leader.commit_index for n in s.nodes)

            wait_until(caught_up, 60, "the follower caught up")
            # 2. stop it gracefully, copy its data directory, start it again
            cluster.kill(follower, signal.SIGTERM)
            backup = tmp_path / "backup"
            shutil.copytree(cluster.node_data_dir(follower), backup)
            assert (backup / "raft" / DUMP_FILE_NAME).exists(), "the copy holds a snapshot"
            cluster.spawn(follower)
            client.publish("audit", b"after the backup")  # not in the backup

        # 3. restore into a new single node: the copy as its data directory, no peers
        base = free_base_port(1)
        data = tmp_path / "restored"
        shutil.copytree(backup, data)
        grpc_address = f"127.0.0.1:{base}"
        serve = [sys.executable, "-m", "broker.cli.main", "serve", "--node-id", "restored", "--cluster-id", "restored",
                 "--data-dir", str(data), "--grpc", grpc_address, "--raft", f"127.0.0.1:{base + RAFT_PORT_OFFSET}",
                 "--metrics", f"127.0.0.1:{base + METRICS_PORT_OFFSET}"]
        # the copy is recorded as the follower's: a start as another node is refused unless adopted
        refused = subprocess.run(serve, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL,
                                 check=False)
        assert refused.returncode == 2, refused.stderr
        assert f"belongs to node {cluster.node_id(follower)!r} of cluster 'local'" in refused.stderr
        log = (tmp_path / "restored.log").open("wb")
        restored = subprocess.Popen([*serve, "--adopt-data-dir"], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        with Client(grpc_address, retry_deadline_s=60) as one:
            wait_until(lambda: one.cluster_status().leader_id == "restored", 120, "the restored node leads itself")
            after = wait_until(lambda: (c := contents(one)) == before and c, 120,
                               "the restored node serves every backed-up record")
            assert after == before
            one.publish("audit", b"new on the restored node")
            assert [r.value for r in one.subscribe("audit", stop_at_end=True)
                    if isinstance(r, Record)][-1] == b"new on the restored node"
            # its own snapshot now holds the new configuration: a restart needs no more forgetting
            wait_until(lambda: not (data / RESTORING_FILE).exists(), 60, "the restore's snapshot was taken")
        restored.send_signal(signal.SIGTERM)
        restored.wait(60)
        restored = subprocess.Popen([*serve, "--adopt-data-dir"], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        with Client(grpc_address, retry_deadline_s=60) as one:
            wait_until(lambda: one.cluster_status().leader_id == "restored", 120, "the restarted node leads itself")
            one.publish("audit", b"after its restart")
            assert [n.id for n in one.cluster_status().nodes] == ["restored"]  # no member of the old cluster
    finally:
        if restored is not None:
            restored.kill()
            restored.wait()
        cluster.stop()
