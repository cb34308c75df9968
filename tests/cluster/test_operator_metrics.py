"""The metrics an operator relies on, scraped from real nodes with traffic: promtool accepts every
endpoint, every documented family is exported (and only those), and the Raft, gRPC, topic and
group figures move as the cluster does."""

from __future__ import annotations

import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.client import Client, Message
from broker.devcluster import DevCluster
from broker.v1 import broker_pb2
from tests.cluster.stubs import refused, stubs
from tests.conftest import wait_until
from tests.metrics_catalog import documented_families, promtool

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

COMPACTION_MIN_ENTRIES = 20  # so that the traffic below makes every node write snapshots


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A 3-node cluster that has seen publishes (fsync durability), reads, a consumer group with a
    dead letter, refused calls and snapshots."""
    env = dict(os.environ, RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES=str(COMPACTION_MIN_ENTRIES))
    c = DevCluster(3, tmp_path_factory.mktemp("metrics"), env=env).start()
    try:
        c.wait_ready(60)
        # unary calls (not the SDK's publish stream), so the per-call gRPC figures below count each
        with Client(c.addresses, retry_deadline_s=30, stream_publishes=False) as client:
            client.create_topic("orders", partitions=2, durability="fsync")
            for i in range(3 * COMPACTION_MIN_ENTRIES):
                client.publish("orders", f"order-{i}", key=str(i))
            assert sum(1 for _ in client.subscribe("orders", stop_at_end=True)) == 3 * COMPACTION_MIN_ENTRIES
            consumer = client.subscribe("orders", group="billing")
            settled = 0
            for item in consumer:
                if isinstance(item, Message):
                    if settled == 0:
                        item.discard("unpayable")
                    else:
                        item.ack()
                    settled += 1
                    if settled == 5:
                        break
            consumer.close()
        yield c
    finally:
        c.stop()


def exposition(address: str) -> str:
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()


def samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def leader_index(c: DevCluster) -> int:
    found: list[int] = []

    def known() -> bool:
        index = c.leader()
        if index is not None:
            found.append(index)
        return index is not None

    wait_until(known, 60, "a leader")
    return found[-1]


def test_promtool_accepts_the_endpoint_of_every_node(busy: DevCluster, tmp_path: Path) -> None:
    for i in range(busy.nodes):
        text = exposition(busy.metrics_address(i))
        result = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, f"node {i}: {result.stdout}{result.stderr}"
        assert not result.stdout.strip() and not result.stderr.strip(), f"node {i}: {result.stdout}{result.stderr}"


def test_every_documented_family_is_exported_and_every_exported_family_is_documented(busy: DevCluster) -> None:
    documented = documented_families()
    exported: dict[str, str] = {}
    for i in range(busy.nodes):  # some families have samples only on the leader; all are declared everywhere
        for family in text_string_to_metric_families(exposition(busy.metrics_address(i))):
            exported[family.name] = family.type
    assert sorted(set(exported) - set(documented)) == [], "exported but not in docs/metrics.md"
    assert sorted(set(documented) - set(exported)) == [], "in docs/metrics.md but not exported"
    wrong = {name: (documented[name], kind) for name, kind in exported.items() if documented[name] != kind}
    assert wrong == {}, "type in docs/metrics.md differs from the endpoint's"


def test_process_raft_grpc_topic_and_group_figures_move_with_the_traffic(busy: DevCluster) -> None:
    leader = leader_index(busy)
    s = stubs(busy.grpc_address(leader))
    try:
        code, _ = refused(lambda: s.broker.Publish(broker_pb2.PublishRequest(
            topic="no-such-topic", records=[broker_pb2.PublishRecord(value=b"x")]), timeout=10))
        assert code == grpc.StatusCode.NOT_FOUND
    finally:
        s.close()
    # grpc.aio's abort sends the status before the exception reaches the metrics wrapper, which
    # counts the call right after: the client can scrape first (a rehearsal did, under load)
    pub = "grpc_method=Publish,grpc_service=broker.v1.Broker,grpc_type=unary"
    not_found = f"raftbroker_grpc_server_handled_total{{grpc_code=NOT_FOUND,{pub}}}"
    m = wait_until(lambda: (m := samples(exposition(busy.metrics_address(leader)))).get(not_found, 0) >= 1 and m,
                   10, "the refused publish to be counted")
    assert isinstance(m, dict)
    assert m["process_resident_memory_bytes"] > 0 and m["process_cpu_seconds_total"] > 0
    assert m["process_open_fds"] > 0 and any(k.startswith("python_info{") for k in m)
    assert m["raftbroker_raft_elections_won_total"] >= 1 and m["raftbroker_raft_elections_started_total"] >= 1
    assert m["raftbroker_raft_leader_changes_total"] >= 1
    followers = [busy.raft_address(i) for i in range(busy.nodes) if i != leader]
    for follower in followers:
        assert f"raftbroker_raft_follower_lag_entries{{follower={follower}}}" in m
        assert f"raftbroker_raft_follower_lag_seconds{{follower={follower}}}" in m
    assert m["raftbroker_raft_journal_fsync_seconds_count"] >= 1  # fsync durability: every entry synced
    assert m["raftbroker_raft_journal_cached_bytes"] > 0 and "raftbroker_raft_journal_read_back_entries_total" in m
    # publishes are counted by the node that answered them (the leader then), deliveries by the node
    # read from: add the nodes up (a busy machine may have moved leadership since)
    total: dict[str, float] = {}
    for i in range(busy.nodes):
        for key, value in samples(exposition(busy.metrics_address(i))).items():
            total[key] = total.get(key, 0.0) + value
    assert total[f"raftbroker_grpc_server_handled_total{{grpc_code=OK,{pub}}}"] >= 3 * COMPACTION_MIN_ENTRIES
    assert total[f"raftbroker_grpc_server_handling_seconds_count{{{pub}}}"] >= 3 * COMPACTION_MIN_ENTRIES + 1
    assert total["raftbroker_publish_records_total{topic=orders}"] == 3 * COMPACTION_MIN_ENTRIES
    assert total["raftbroker_publish_bytes_total{topic=orders}"] > 0
    assert total["raftbroker_deliver_records_total{topic=orders}"] >= 3 * COMPACTION_MIN_ENTRIES
    assert total["raftbroker_deliver_bytes_total{topic=orders}"] > 0
    dead = sum(v for k, v in m.items() if k.startswith("raftbroker_group_dead_letters{group=billing,"))
    assert dead == 1
    assert any(k.startswith("raftbroker_group_lag_records{group=billing,") for k in m)
    assert any(k.startswith("raftbroker_group_lag_seconds{group=billing,") for k in m)
    assert any(k.startswith("raftbroker_group_in_flight{group=billing,") for k in m)
    assert m["raftbroker_store_size_bytes"] > 0
    assert 0 < m["raftbroker_data_dir_filesystem_free_bytes"] <= m["raftbroker_data_dir_filesystem_size_bytes"]
    # followers compact their log after COMPACTION_MIN_ENTRIES (spread up to 1.5x; a leader waits 4x as
    # long): the ~70 entries so far make both followers write a snapshot
    wait_until(lambda: sum(samples(exposition(busy.metrics_address(i)))
                           ["raftbroker_raft_snapshot_seconds_count{kind=write}"] >= 1 for i in range(busy.nodes)) >= 2,
               60, "two nodes to have written a snapshot")


def test_a_subscription_to_a_missing_topic_creates_no_series(busy: DevCluster) -> None:
    leader = leader_index(busy)
    s = stubs(busy.grpc_address(leader))
    try:
        code, _ = refused(lambda: list(s.broker.Subscribe(broker_pb2.SubscribeRequest(topic="ghost"), timeout=10)))
        assert code == grpc.StatusCode.NOT_FOUND
    finally:
        s.close()
    leaked = [k for k in samples(exposition(busy.metrics_address(leader))) if "topic=ghost" in k]
    assert leaked == []  # a client could otherwise grow the exposition with made-up topic names


def test_the_leader_reports_a_stopped_followers_lag_in_entries_and_seconds(busy: DevCluster) -> None:
    leader = leader_index(busy)
    down = (leader + 1) % busy.nodes
    lag_entries = f"raftbroker_raft_follower_lag_entries{{follower={busy.raft_address(down)}}}"
    lag_seconds = f"raftbroker_raft_follower_lag_seconds{{follower={busy.raft_address(down)}}}"
    busy.kill(down)
    try:
        with Client([busy.grpc_address(leader)], retry_deadline_s=30) as client:
            # enough for the leader to compact its log (4x deferred on a leader, spread up to 1.5x):
            # the follower then catches up by installing a snapshot
            for i in range(8 * COMPACTION_MIN_ENTRIES):
                client.publish("orders", f"while-down-{i}")

        def lagging() -> bool:
            m = samples(exposition(busy.metrics_address(leader)))
            return m.get(lag_entries, 0) >= 5 and m.get(lag_seconds, 0) > 0

        wait_until(lagging, 30, "the leader to report the stopped follower's lag")
    finally:
        busy.restart(down)
    wait_until(lambda: samples(exposition(busy.metrics_address(leader))).get(lag_entries) == 0, 90,
               "the restarted follower to catch up")
    assert samples(exposition(busy.metrics_address(leader)))[lag_seconds] == 0
    restored = samples(exposition(busy.metrics_address(down)))["raftbroker_raft_snapshot_seconds_count{kind=restore}"]
    assert restored >= 1  # it was sent the leader's snapshot
