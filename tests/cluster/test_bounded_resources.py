"""Two million records through a 3-node cluster: memory and journal stay bounded (log compaction
with RocksDB snapshots works), and every record is there afterwards."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import grpc
import pytest

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2
from tests.cluster.digests import topic_end_offsets, wait_converged
from tests.cluster.stubs import stubs
from tests.conftest import rss_bytes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

TOTAL = 2_000_000
BATCH = 2_000
THREADS = 4
RSS_LIMIT_BYTES = 1 << 30  # a node that kept every command in memory would pass 2 GiB



def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def publish(c: DevCluster, request: broker_pb2.PublishRequest, deadline_s: float = 120.0) -> None:
    """Publish through whoever leads, resending while the cluster elects (bounded)."""
    deadline = time.monotonic() + deadline_s
    while True:
        s = stubs(c.wait_ready(max(1.0, deadline - time.monotonic())))
        try:
            s.broker.Publish(request, timeout=60)
            return
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                    or time.monotonic() > deadline:
                raise
        finally:
            s.close()


def test_two_million_records_keep_rss_and_journal_bounded(tmp_path: Path) -> None:
    env = dict(os.environ, RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES="200")
    c = DevCluster(3, tmp_path, env=env).start()
    try:
        s = stubs(c.wait_ready(60))
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="bulk", partitions=4)))
        peak = {i: 0 for i in range(c.nodes)}
        errors: list[BaseException] = []

        def publisher(k: int, batches: int) -> None:
            # a producer session per thread (dedup_id + msg ids, one watermark per batch): a batch
            # resent after a leader change (a busy machine has elections) is stored once, so the
            # count below stays exact
            try:
                for b in range(batches):
                    request = broker_pb2.PublishRequest(topic="bulk", dedup_id=f"bulk-{k}", records=[
                        broker_pb2.PublishRecord(value=b"v" * 100, msg_id=1 + b * BATCH + j) for j in range(BATCH)])
                    publish(c, request)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=publisher, args=(k, TOTAL // BATCH // THREADS)) for k in range(THREADS)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            for i, pid in enumerate(c.pids):
                if pid is not None:
                    peak[i] = max(peak[i], rss_bytes(pid))
            threads[0].join(0.5)
        for t in threads:
            t.join()
        assert not errors, errors[0]
        s.close()
        wait_converged(c, 120)
        for i in range(c.nodes):
            assert sum(topic_end_offsets(c.grpc_address(i), "bulk")) == TOTAL
        raft_dirs = {i: dir_bytes(c.node_data_dir(i) / "raft") for i in range(c.nodes)}
        print(f"peak RSS per node (MiB): { {i: round(v / 2**20) for i, v in peak.items()} }; "
              f"raft dir (MiB): { {i: round(v / 2**20) for i, v in raft_dirs.items()} }")
        assert all(v < RSS_LIMIT_BYTES for v in peak.values()), peak
        # the journal holds what follows the last snapshot; the dump is a store checkpoint
        store = {i: dir_bytes(c.node_data_dir(i) / "store") for i in range(c.nodes)}
        assert all(raft_dirs[i] < 2 * store[i] + (256 << 20) for i in range(c.nodes)), (raft_dirs, store)
    finally:
        c.stop()
