"""Retention, prune, schemas, dedup fields, filters and drop against a real cluster (SPEC §2.2-§3.4)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import grpc
import pytest

from broker.devcluster import DevCluster
from broker.storage import Column
from broker.storage.rocks import RocksStore
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.digests import wait_converged
from tests.cluster.stubs import Stubs, stubs
from tests.conftest import start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def leader_stubs(c: DevCluster) -> Stubs:
    return stubs(c.wait_ready(60))


def code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value.code()


def items(s: Stubs, topic: str, **kw: object) -> list[common_pb2.Record | common_pb2.Event]:
    out: list[common_pb2.Record | common_pb2.Event] = []
    for item in s.broker.Subscribe(broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True, **kw),  # type: ignore[arg-type]
                                   timeout=30):
        out.extend(item.batch.records) if item.HasField("batch") else out.append(item.event)
    return out


def test_policies_prune_and_drop(tmp_path: Path) -> None:
    c = start_cluster(tmp_path)
    try:
        s = leader_stubs(c)
        create = s.admin.CreateTopic
        create(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
            name="full", full_policy=common_pb2.FULL_POLICY_REJECT, retention=common_pb2.Retention(max_records=3))))
        pub = s.broker.Publish
        pub(broker_pb2.PublishRequest(topic="full", records=[broker_pb2.PublishRecord(value=b"x")] * 3))
        assert code(lambda: pub(broker_pb2.PublishRequest(topic="full", records=[broker_pb2.PublishRecord(
            value=b"y")]))) == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a record over max_bytes alone could never be kept: refused, not acknowledged and deleted at once
        create(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
            name="small", retention=common_pb2.Retention(max_bytes=100))))
        assert code(lambda: pub(broker_pb2.PublishRequest(topic="small", records=[broker_pb2.PublishRecord(
            value=b"z" * 200)]))) == grpc.StatusCode.INVALID_ARGUMENT
        assert s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="small")).partitions[0].end_offset == 0

        schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
        create(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="typed", schema_json=schema,
                                                                         dedup_fields=["n"])))
        assert code(lambda: create(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
            name="broken", schema_json='{"type": 7}')))) == grpc.StatusCode.INVALID_ARGUMENT
        good = broker_pb2.PublishRecord(value=b'{"n": 1}', headers={"src": "a"})
        bad = broker_pb2.PublishRecord(value=b'{"n": "one"}')
        assert code(lambda: pub(broker_pb2.PublishRequest(topic="typed", records=[good, bad]))) == \
            grpc.StatusCode.INVALID_ARGUMENT
        assert items(s, "typed") == []  # nothing of the refused batch
        pub(broker_pb2.PublishRequest(topic="typed", records=[good, broker_pb2.PublishRecord(value=b'{"n": 2}')]))
        filtered = items(s, "typed", filter='headers.src == "a" && value.n == 1')
        assert [r.value for r in filtered] == [b'{"n": 1}']
        assert code(lambda: items(s, "typed", filter="value.n ==")) == grpc.StatusCode.INVALID_ARGUMENT

        create(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="log")))
        pub(broker_pb2.PublishRequest(topic="log", records=[broker_pb2.PublishRecord(value=b"%d" % i)
                                                            for i in range(10)]))
        token = items(s, "log")[2].position
        assert s.admin.Prune(admin_pb2.PruneRequest(topic="log", before_offset=6)).records_pruned == 6
        # a bound past the end is refused whole (a typo of one digit too many used to empty the partition)
        with pytest.raises(grpc.RpcError) as past:
            s.admin.Prune(admin_pb2.PruneRequest(topic="log", before_offset=11))
        assert past.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "before_offset 11 is past the end of partition 0 (10)" in (past.value.details() or "")
        assert s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="log")).partitions[0].start_offset == 6
        s.close()

        old = c.leader()
        assert old is not None
        c.kill(old)  # the gap is signalled by whichever node leads next
        wait_until(lambda: c.leader() is not None, 30, "a new leader")
        s = leader_stubs(c)
        got = items(s, "log", **{"from": common_pb2.Position(token=token)})
        assert got[0].type == common_pb2.EVENT_TYPE_SKIP_FORWARD
        assert (got[0].offset_before, got[0].offset_after) == (3, 6)
        assert [r.offset for r in got[1:]] == [6, 7, 8, 9]
        # dedup fields hold across the failover
        assert code(lambda: s.broker.Publish(broker_pb2.PublishRequest(
            topic="typed", records=[broker_pb2.PublishRecord(value=b'{"n": 2}')]))) == grpc.StatusCode.ALREADY_EXISTS
        c.spawn(old)
        c.wait_ready(60)

        topic_id = s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="log")).incarnation
        s.admin.DropTopic(admin_pb2.DropTopicRequest(name="log"))
        s.close()
        wait_converged(c)
    finally:
        c.stop()
    prefix = struct.pack(">I", topic_id)
    end = struct.pack(">I", topic_id + 1)
    for i in range(3):  # nothing of the dropped topic is left in any node's store
        store = RocksStore(c.node_data_dir(i) / "store")
        try:
            assert list(store.scan(Column.RECORDS, prefix, end)) == [], f"node {i} kept records"
            assert list(store.scan(Column.DEDUP, prefix, end)) == [], f"node {i} kept dedup state"
            assert [k for k, _ in store.scan(Column.META, b"p/" + prefix, b"p/" + end)] == []
        finally:
            store.close()
