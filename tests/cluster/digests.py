"""Reading a whole topic from one node, to compare replicas."""

from __future__ import annotations

import hashlib

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.stubs import stubs
from tests.conftest import wait_until


def partition_contents(address: str, topic: str, partition: int) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of one partition, read from the node at ``address``."""
    s = stubs(address)
    try:
        req = broker_pb2.SubscribeRequest(topic=topic, partition=partition, stop_at_end=True, max_batch=5000)
        out: list[tuple[int, bytes]] = []
        for item in s.broker.Subscribe(req, timeout=300):  # a big partition from a busy node
            assert item.HasField("batch"), f"unexpected event {item.event}"
            out.extend((r.offset, r.value) for r in item.batch.records)
        return out
    finally:
        s.close()


def digest(contents: list[tuple[int, bytes]]) -> str:
    h = hashlib.sha256()
    for offset, value in contents:
        h.update(b"%d:" % offset + hashlib.sha256(value).digest())
    return h.hexdigest()


def wait_converged(cluster: DevCluster, timeout_s: float = 60) -> int:
    """Wait until every running node has applied the same index; return it."""
    def converged() -> int | None:
        views = [cluster.node_status(i) for i in range(cluster.nodes) if cluster.alive(i)]
        if any(v is None for v in views):
            return None
        applied = {v.applied_index for v in views if v is not None}
        commits = {v.commit_index for v in views if v is not None}
        return applied.pop() if len(applied) == 1 and max(commits) <= min(v.applied_index for v in views if v) else None

    result = wait_until(converged, timeout_s, "all nodes to apply the same index")
    assert isinstance(result, int)
    return result


def topic_end_offsets(address: str, topic: str) -> list[int]:
    s = stubs(address)
    try:
        info = s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name=topic))
        return [p.end_offset for p in info.partitions]
    finally:
        s.close()


_ = common_pb2  # re-exported types used by callers' annotations
