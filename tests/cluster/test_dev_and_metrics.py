"""`raftbroker dev` as a user runs it, and the metrics every node serves."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.devcluster import DevCluster, free_base_port
from broker.v1 import admin_pb2, broker_pb2
from tests.cluster.stubs import stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_dev_prints_ready_reports_a_dead_node_and_stops_every_node_on_sigint(tmp_path: Path) -> None:
    base = free_base_port(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker.cli.main", "dev", "--nodes", "3", "--data-dir", str(tmp_path),
         "--base-port", str(base)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()

    def next_line_matching(prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if prefix in line:
                return line
        raise AssertionError(f"no line with {prefix!r} within {timeout_s} s")

    try:
        ready = next_line_matching("cluster ready: ", 60)
        assert ready.strip() == "cluster ready: " + ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        s = stubs(f"127.0.0.1:{base}")
        status = s.admin.ClusterStatus(admin_pb2.ClusterStatusRequest(), timeout=10)
        s.close()
        pids = [n.pid for n in status.nodes]
        assert len(pids) == 3 and all(n.reachable for n in status.nodes)
        assert sum(n.role == "leader" for n in status.nodes) == 1
        os.kill(pids[2], signal.SIGKILL)  # reported, not silently restarted
        assert "n3" in next_line_matching("exited with code", 10)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        assert proc.returncode == 0
        wait_until(lambda: not any(_pid_alive(p) for p in pids), 15, "every node to exit")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def scrape(address: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"{{{k}={v}}}" for k, v in sorted(sample.labels.items()))
            out[key] = sample.value
    return out


def test_metrics_report_raft_state_and_publishes(cluster: DevCluster) -> None:
    leader = cluster.wait_ready()
    s = stubs(leader)
    s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="metered")))
    published = broker_pb2.PublishRequest(topic="metered", records=[broker_pb2.PublishRecord(value=b"x" * 10)
                                                                    for _ in range(7)])
    s.broker.Publish(published)
    s.close()
    index = cluster.addresses.index(leader)
    m = scrape(cluster.metrics_address(index))
    assert m["raftbroker_raft_role{role=leader}"] == 1
    assert m["raftbroker_raft_term"] >= 1
    assert m["raftbroker_raft_applied_index"] >= 2
    assert m["raftbroker_publish_records_total{topic=metered}"] == 7
    assert m["raftbroker_publish_bytes_total{topic=metered}"] == published.ByteSize()  # the request as sent
    assert m["raftbroker_publish_latency_seconds_count"] >= 1
    assert "raftbroker_subscribers" in m and "raftbroker_store_size_bytes" in m
    assert m["raftbroker_raft_has_quorum"] == 1
    follower = scrape(cluster.metrics_address((index + 1) % cluster.nodes))
    assert follower["raftbroker_raft_role{role=follower}"] == 1
    assert follower["raftbroker_raft_has_quorum"] == 0  # a leader's figure: NoQuorum's max by (job) reads it


def test_the_byte_counters_count_the_messages_that_carry_records(cluster: DevCluster) -> None:
    """``publish_bytes`` adds the acknowledged publish requests' bytes as received, ``deliver_bytes``
    the bytes of every response that delivered records, as sent: compact, whole-record and filtered
    (per-record) reads, each compared with the bytes the client received. A refused publish and a
    read that delivers nothing add nothing."""
    leader = cluster.wait_ready()
    index = cluster.addresses.index(leader)
    s = stubs(leader)
    raw_subscribe = s.channel.unary_stream("/broker.v1.Broker/Subscribe",
                                           request_serializer=broker_pb2.SubscribeRequest.SerializeToString,
                                           response_deserializer=None)  # the response bytes as received
    try:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="sized", partitions=2)))
        plain = broker_pb2.PublishRequest(topic="sized", records=[
            broker_pb2.PublishRecord(value=os.urandom(i * 37), key=b"k%d" % i if i % 3 else b"",
                                     headers={"h": "v"} if i % 4 == 0 else {}) for i in range(40)])
        packed = broker_pb2.PublishRequest(topic="sized", packed_records=[
            broker_pb2.PublishRecord(value=os.urandom(1000 + i)).SerializeToString() for i in range(25)])
        s.broker.Publish(plain)
        s.broker.Publish(packed)
        with pytest.raises(grpc.RpcError):  # no such topic: refused, not counted
            s.broker.Publish(broker_pb2.PublishRequest(topic="absent", records=[broker_pb2.PublishRecord(value=b"v")]))
        sent, records, in_partition_1 = 0, 0, 0
        for compact, cel in ((True, ""), (False, ""), (False, "partition == 1")):
            req = broker_pb2.SubscribeRequest(topic="sized", stop_at_end=True, compact=compact, filter=cel,
                                              max_batch=9)
            for data in raw_subscribe(req, timeout=30):
                response = broker_pb2.SubscribeResponse.FromString(data)
                got = response.compact.records or response.batch.records
                if got:
                    sent += len(data)
                    records += len(got)
                if not compact and not cel:
                    in_partition_1 += sum(r.partition == 1 for r in response.batch.records)
        assert 0 < in_partition_1 < 65 and records == 65 + 65 + in_partition_1
        with pytest.raises(grpc.RpcError):  # an expression that does not compile: nothing delivered
            list(raw_subscribe(broker_pb2.SubscribeRequest(topic="sized", stop_at_end=True, filter="(("), timeout=30))
        m = scrape(cluster.metrics_address(index))
        assert m["raftbroker_publish_records_total{topic=sized}"] == 65
        assert m["raftbroker_publish_bytes_total{topic=sized}"] == plain.ByteSize() + packed.ByteSize()
        assert m["raftbroker_deliver_records_total{topic=sized}"] == records
        assert m["raftbroker_deliver_bytes_total{topic=sized}"] == sent
    finally:
        s.close()


def test_the_series_of_a_dropped_topic_are_removed(cluster: DevCluster) -> None:
    leader = cluster.wait_ready()
    index = cluster.addresses.index(leader)
    s = stubs(leader)
    try:
        for round_ in range(3):
            s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="churn")))
            s.broker.Publish(broker_pb2.PublishRequest(topic="churn", records=[broker_pb2.PublishRecord(value=b"xy")]))
            req = broker_pb2.SubscribeRequest(topic="churn", stop_at_end=True)
            assert sum(len(i.batch.records) for i in s.broker.Subscribe(req, timeout=30)) == 1
            if round_ == 0:  # a group outlives the drops; each re-created topic's first access rebases it
                s.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="churn", group="churners"))
            assert s.admin.GroupLag(admin_pb2.GroupLagRequest(topic="churn", group="churners")).partitions[0].lag == 1
            m = scrape(cluster.metrics_address(index))
            assert m["raftbroker_publish_records_total{topic=churn}"] == 1, round_  # counted from zero again
            assert m["raftbroker_deliver_records_total{topic=churn}"] == 1
            assert m["raftbroker_group_lag_records{group=churners}{partition=0}{topic=churn}"] == 1
            s.admin.DropTopic(admin_pb2.DropTopicRequest(name="churn"))
            m = scrape(cluster.metrics_address(index))
            assert not [k for k in m if "topic=churn" in k], [k for k in m if "topic=churn" in k]
    finally:
        s.close()
