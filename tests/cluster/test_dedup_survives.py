"""Idempotency keys, dedup watermarks and dedup fields survive leader failover, whole-cluster
restart and snapshots (SPEC §4)."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from broker.client import Client
from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2
from tests.cluster.stubs import stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def publish(c: DevCluster, req: broker_pb2.PublishRequest) -> broker_pb2.PublishResponse:
    """Publish to whichever node leads now (retrying through elections)."""
    def attempt() -> broker_pb2.PublishResponse | None:
        leader = c.leader()
        if leader is None:
            return None
        s = stubs(c.grpc_address(leader))
        try:
            resp: broker_pb2.PublishResponse = s.broker.Publish(req, timeout=10)
            return resp
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNAVAILABLE:
                return None
            raise
        finally:
            s.close()

    result = wait_until(attempt, 60, "a leader to accept the publish", interval_s=0.1)
    assert isinstance(result, broker_pb2.PublishResponse)
    return result


def keyed(key: str) -> broker_pb2.PublishRequest:
    return broker_pb2.PublishRequest(topic="d", records=[broker_pb2.PublishRecord(value=key.encode(),
                                                                                  idempotency_key=key)])


def session(*ids: int) -> broker_pb2.PublishRequest:
    return broker_pb2.PublishRequest(topic="d", dedup_id="feed", records=[
        broker_pb2.PublishRecord(value=b"m%d" % abs(i), msg_id=i) for i in ids])


PAGE = broker_pb2.PublishRequest(topic="u", records=[broker_pb2.PublishRecord(value=b'{"url": "a", "n": 2}')])


def refused(c: DevCluster, req: broker_pb2.PublishRequest) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        publish(c, req)
    return info.value.code()


def test_dedup_state_survives_failover_restart_and_snapshots(tmp_path: Path) -> None:
    env = dict(os.environ, RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES="20")
    c = DevCluster(3, tmp_path, env=env).start()
    try:
        c.wait_ready(60)
        with Client(c.addresses, retry_deadline_s=30) as client:  # follows the leader through an election
            client.create_topic("d", dedup_window_ms=-1)
            client.create_topic("u", dedup_fields=["url"])
        publish(c, broker_pb2.PublishRequest(topic="u", records=[broker_pb2.PublishRecord(value=b'{"url": "a"}')]))
        first = publish(c, keyed("k-1")).results[0]
        assert not publish(c, session(1, 2, 3)).results[0].duplicate
        for i in range(40):  # enough commands for several compactions
            publish(c, keyed(f"filler-{i}"))

        leader = c.leader()
        assert leader is not None
        c.kill(leader)  # failover
        again = publish(c, keyed("k-1")).results[0]
        assert again.duplicate and (again.partition, again.offset) == (first.partition, first.offset)
        assert [r.duplicate for r in publish(c, session(3, 4)).results] == [True, False]
        assert refused(c, PAGE) == grpc.StatusCode.ALREADY_EXISTS

        for i in range(c.nodes):  # whole-cluster kill -9 and restart
            c.kill(i)
        for i in range(c.nodes):
            c.spawn(i)
        c.wait_ready(60)
        assert publish(c, keyed("k-1")).results[0].duplicate
        assert [r.duplicate for r in publish(c, session(4, -5)).results] == [True, False]
        assert refused(c, PAGE) == grpc.StatusCode.ALREADY_EXISTS, "dedup fields are permanent"
        s = stubs(c.grpc_address(c.leader() or 0))
        marks = s.admin.GetWatermarks(admin_pb2.GetWatermarksRequest(topic="d")).watermarks
        assert [(m.dedup_id, m.msg_id) for m in marks] == [("feed", 5)]
        info = s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="d"))
        assert info.partitions[0].end_offset == 1 + 3 + 40 + 1 + 1  # each message stored exactly once
        s.close()
    finally:
        c.stop()
