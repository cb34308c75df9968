"""Issue 15 item 6: ``Publish`` awaits its commit on the gRPC event loop, with no call-pool thread.

- a unary Publish hands nothing to the call pool (the pool of sync handlers); a topic with a JSON
  schema has its checks run there, and only those (a real node in this process, so that the pool's
  submissions can be counted, driven over gRPC);
- a client that gives up on a publish that cannot commit (no quorum: the followers are stopped)
  leaves the leader healthy, with no error logged when the outcome arrives late, and the next
  publish succeeds (a cluster of separate processes).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import pytest
import uvloop
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.client import Client
from broker.config import NodeConfig
from broker.devcluster import DevCluster
from broker.node import Node
from broker.replication import Role
from broker.v1 import admin_pb2, broker_pb2
from tests.cluster.stubs import stubs
from tests.conftest import start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
PUBLISHES = 50
SCHEMA = json.dumps({"type": "object", "required": ["n"]})


def lone_node_config(tmp_path: Path) -> NodeConfig:
    addresses = DevCluster(1, tmp_path)  # free ports and paths only: nothing is spawned
    return NodeConfig(node_id=addresses.node_id(0), data_dir=addresses.node_data_dir(0),
                      grpc_address=addresses.grpc_address(0), raft_address=addresses.raft_address(0),
                      metrics_address=addresses.metrics_address(0))


@pytest.fixture
def lone_node(tmp_path: Path) -> Iterator[Node]:
    """A one-node cluster run in this process (its store, Raft, gRPC server), leading."""
    node = Node(lone_node_config(tmp_path))
    try:
        node.start()
        wait_until(lambda: node.replicator.status().role == Role.LEADER, 60, "the lone node to lead")
        yield node
    finally:
        node.close()


class PoolSubmissions:
    """Every task handed to ``pool.submit`` (how the gRPC server runs a sync handler, and
    ``StreamRuntime.call``), recorded as (fn, args) while it is installed."""

    def __init__(self, pool: Any) -> None:
        self.tasks: list[tuple[Callable[..., object], tuple[object, ...]]] = []
        self._pool = pool
        self._submit = pool.submit

    def __enter__(self) -> PoolSubmissions:
        def submit(fn: Callable[..., object], *args: object, **kwargs: object) -> Future[object]:
            self.tasks.append((fn, args))
            return self._submit(fn, *args, **kwargs)

        self._pool.submit = submit
        return self

    def __exit__(self, *exc: object) -> None:
        del self._pool.submit  # the class's own method again

    def publish_handlers(self) -> int:
        """Tasks that received a PublishRequest: the sync Publish handler on the call pool."""
        return sum(1 for _, args in self.tasks if any(isinstance(a, broker_pb2.PublishRequest) for a in args))

    def prepares(self) -> int:
        """Publishes prepared on the pool (``TopicLog.prepare_publish`` via ``StreamRuntime.call``)."""
        return sum(1 for fn, _ in self.tasks if getattr(getattr(fn, "func", None), "__name__", "") == "prepare_publish")


def test_a_unary_publish_takes_no_call_pool_thread_and_schema_checks_do(lone_node: Node) -> None:
    s = stubs(lone_node.config.grpc_address)
    try:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="plain")), timeout=30)
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
            name="checked", schema_json=SCHEMA)), timeout=30)
        with PoolSubmissions(lone_node.streams.call_pool) as pool:
            for i in range(PUBLISHES):
                response = s.broker.Publish(broker_pb2.PublishRequest(
                    topic="plain", records=[broker_pb2.PublishRecord(value=b"v%d" % i)]), timeout=30)
                assert response.results[0].offset == i
            for i in range(5):
                s.broker.Publish(broker_pb2.PublishRequest(topic="checked", records=[
                    broker_pb2.PublishRecord(value=json.dumps({"n": i}).encode())]), timeout=30)
            with pytest.raises(grpc.RpcError) as refused:  # the schema check runs, on the pool, and refuses
                s.broker.Publish(broker_pb2.PublishRequest(topic="checked", records=[
                    broker_pb2.PublishRecord(value=b"{}")]), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert pool.publish_handlers() == 0, f"{pool.publish_handlers()} publishes ran a call-pool thread"
        assert pool.prepares() == 6, pool.tasks
    finally:
        s.close()


def test_the_server_runs_on_uvloop(lone_node: Node) -> None:
    """The node's gRPC server, its handlers and its streams run on uvloop's event loop."""
    assert isinstance(lone_node.server.loop, uvloop.Loop), type(lone_node.server.loop)
    s = stubs(lone_node.config.grpc_address)
    try:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="t")), timeout=30)
        response = s.broker.Publish(broker_pb2.PublishRequest(
            topic="t", records=[broker_pb2.PublishRecord(value=b"v")]), timeout=30)
        assert response.results[0].offset == 0
    finally:
        s.close()


def _signal_followers(c: DevCluster, leader: int, sig: int) -> None:
    for i in range(3):
        pid = c.pids[i]
        if i != leader and pid is not None:
            os.kill(pid, sig)


def test_a_publish_given_up_without_a_quorum_leaves_the_leader_healthy(tmp_path: Path) -> None:
    c = start_cluster(tmp_path)
    stopped, leader_index = False, -1
    try:
        with Client(c.addresses) as client:
            client.create_topic("gone")
            client.publish("gone", b"before")
        leader = wait_until(lambda: c.leader() is not None and str(c.leader()), 60, "a leader")
        leader_index = int(str(leader))
        s = stubs(c.grpc_address(leader_index))
        try:
            _signal_followers(c, leader_index, signal.SIGSTOP)  # connections stay open: the leader keeps leading
            stopped = True
            codes = []
            for i in range(3):  # well within the leader's fall-back timeout (3 s)
                with pytest.raises(grpc.RpcError) as gave_up:
                    s.broker.Publish(broker_pb2.PublishRequest(topic="gone", records=[
                        broker_pb2.PublishRecord(value=b"lost %d" % i)]), timeout=0.5)
                codes.append(gave_up.value.code())
            assert grpc.StatusCode.DEADLINE_EXCEEDED in codes, codes  # at least one waited, then the client left
            _signal_followers(c, leader_index, signal.SIGCONT)
            stopped = False
        finally:
            s.close()
        with Client(c.addresses) as client:  # the late outcomes arrive before this one commits
            assert client.publish("gone", b"after").duplicate is False
        wait_until(lambda: c.node_status(leader_index) is not None, 60, "the old leader to answer")
        log = c.log_path(leader_index).read_text(errors="replace")
        for sign in ("Traceback", "Exception in callback", "InvalidStateError", "Task exception was never"):
            assert sign not in log, f"{sign!r} in the leader's log:\n{log[-4000:]}"
        s = stubs(c.grpc_address(leader_index))
        try:
            health = health_pb2_grpc.HealthStub(s.channel)
            wait_until(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                       == health_pb2.HealthCheckResponse.SERVING, 60, "the old leader to be SERVING")
        finally:
            s.close()
    finally:
        if stopped:
            _signal_followers(c, leader_index, signal.SIGCONT)
        c.stop()


def test_a_closed_node_frees_its_ports_and_ends_its_metrics_thread(tmp_path: Path) -> None:
    """In-process nodes (tests, embedders) leave nothing serving: the metrics server's thread held the
    whole node, its grpc.aio server and gRPC's poller thread alive until the interpreter exited."""
    config = lone_node_config(tmp_path)
    node = Node(config)
    before = set(threading.enumerate())
    try:
        node.start()
        with urllib.request.urlopen(f"http://{config.metrics_address}/metrics", timeout=10) as answer:
            assert answer.status == 200
        started = [t for t in set(threading.enumerate()) - before if t.name.startswith("metrics-")]
        assert started, "the metrics server runs on threads of its own (broker.services.metrics_server)"
    finally:
        node.close()
    assert all(not t.is_alive() for t in started)
    for address in (config.metrics_address, config.grpc_address):
        host, port = address.rsplit(":", 1)
        with pytest.raises(ConnectionRefusedError), socket.create_connection((host, int(port)), timeout=5):
            pass
