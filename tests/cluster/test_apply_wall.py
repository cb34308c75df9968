"""One committed command must never stop the cluster (issue 11, item 2): commands that no leader
would submit are put straight into the Raft log of a real cluster, and every node records the same
failure, moves its applied index on, keeps serving, and replays them after a restart.

The cluster is two ``raftbroker serve`` processes plus one node run inside the test process (a real
``Node``: store, replicator, gRPC server): the only way to reach the replicator without a test hook
on a production port. The test makes the in-process node the leader and submits raw bytes to it.
"""

from __future__ import annotations

import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.config import NodeConfig, PeerConfig
from broker.core import formats
from broker.core.applied import Rejected
from broker.core.errors import ApplyFailed, InvalidArgument
from broker.core.groups.config import normalized_group_config
from broker.devcluster import DevCluster
from broker.node import Node
from broker.replication import ReplicationError
from broker.v1 import admin_pb2, broker_pb2, internal_pb2
from tests.cluster.stubs import Stubs, stubs
from tests.cluster.test_route_metrics import sample, scrape
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
K = internal_pb2
LOCAL = 2  # the index of the in-process node
LEADER_ATTEMPTS_MAX = 12


class Mixed:
    """Nodes 0 and 1 as processes (``cluster``), node 2 in this process (``node``)."""

    def __init__(self, tmp: Path) -> None:
        self.cluster = DevCluster(3, tmp)
        c = self.cluster
        peers = [PeerConfig(id=c.node_id(j), raft_address=c.raft_address(j), grpc_address=c.grpc_address(j))
                 for j in range(2)]
        self.config = NodeConfig(node_id=c.node_id(LOCAL), data_dir=c.node_data_dir(LOCAL),
                                 grpc_address=c.grpc_address(LOCAL), raft_address=c.raft_address(LOCAL),
                                 metrics_address=c.metrics_address(LOCAL), peers=peers)
        self.node: Node | None = None

    def start(self) -> None:
        self.cluster.data_dir.mkdir(parents=True, exist_ok=True)
        self.cluster.spawn(0)
        self.cluster.spawn(1)
        self.node = Node(self.config)
        self.node.start()

    def stop(self) -> None:
        try:
            self.cluster.stop()
        finally:
            if self.node is not None:
                self.node.close()

    def leader(self) -> int | None:
        """The index every node agrees leads (the in-process node included), if any."""
        views = [self.cluster.node_status(i) for i in range(3)]
        if any(v is None for v in views):
            return None
        leaders = {v.leader_id for v in views if v is not None}
        if len(leaders) != 1 or not (leader := leaders.pop()):
            return None
        return int(leader[1:]) - 1

    def applied(self) -> list[int]:
        return [v.applied_index if v is not None else -1 for v in (self.cluster.node_status(i) for i in range(3))]

    def make_local_leader(self) -> None:
        """Stop whichever process leads (it hands leadership to a caught-up peer) until the
        in-process node is chosen; restart the stopped process each time."""
        for _ in range(LEADER_ATTEMPTS_MAX):
            found = wait_until(lambda: (self.leader(),) if self.leader() is not None else None, 60,
                               "a leader every node agrees on")
            assert isinstance(found, tuple)
            index: int = found[0]
            if index == LOCAL:
                return
            self.cluster.kill(index, signal.SIGTERM)
            wait_until(self._local_sees_leader, 60, "a new leader")
            self.cluster.spawn(index)
        raise AssertionError(f"the in-process node was not elected in {LEADER_ATTEMPTS_MAX} hand-overs")

    def _local_sees_leader(self) -> bool:
        assert self.node is not None
        return self.node.replicator.status().leader_address is not None

    def submit_raw(self, command: bytes, timeout_s: float = 60) -> object:
        """Append ``command`` as it is to the Raft log through the in-process leader; its result."""
        assert self.node is not None
        done = threading.Event()
        outcome: list[object] = []

        def callback(result: object, error: ReplicationError | None) -> None:
            outcome.append(error if error is not None else result)
            done.set()

        self.node.replicator.submit(command, callback)
        assert done.wait(timeout_s), "the command was not applied: the log is stuck"
        assert not isinstance(outcome[0], ReplicationError), outcome[0]
        return outcome[0]


@pytest.fixture
def mixed(tmp_path: Path) -> Iterator[Mixed]:
    m = Mixed(tmp_path)
    try:
        m.start()
        yield m
    finally:
        m.stop()


def publish_canary(s: Stubs, topic: str, value: bytes) -> int:
    response = s.broker.Publish(broker_pb2.PublishRequest(topic=topic, records=[broker_pb2.PublishRecord(value=value)]),
                                timeout=30)
    return int(response.results[0].offset)


def contents(address: str, topic: str) -> list[bytes]:
    s = stubs(address)
    try:
        req = broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True)
        return [r.value for item in s.broker.Subscribe(req, timeout=30) if item.HasField("batch")
                for r in item.batch.records]
    finally:
        s.close()


def poison_commands(topic: str) -> list[tuple[bytes, type[Exception], str]]:
    """Commands a leader now refuses before submitting, each with the error every node records."""
    config = normalized_group_config(K.GroupConfig())
    long_topic = "x" * 245
    return [
        (K.Command(create_group=K.CreateGroupCommand(topic=topic, topic_id=1, group="g\n", config=config,
                                                     now_ms=1, start_offsets=[0])).SerializeToString(),
         InvalidArgument, "dead-letter topic name"),
        (K.Command(create_group=K.CreateGroupCommand(topic=long_topic, topic_id=2, group="g", config=config,
                                                     now_ms=1, start_offsets=[0])).SerializeToString(),
         InvalidArgument, "too long"),
        # malformed: two commit partitions, one offset (the settle apply zips them strictly)
        (K.Command(group_settle=K.GroupSettleCommand(topic=topic, group="g", group_id=1, now_ms=1,
                                                     commit_partitions=[0, 0], commit_offsets=[1])
                   ).SerializeToString(), ApplyFailed, "group_settle"),
        # malformed: two partitions, one body
        (K.Command(append=K.AppendCommand(topic=topic, topic_id=1, now_ms=1, partitions=[0, 0],
                                          bodies=[b""])).SerializeToString(), ApplyFailed, "append"),
        (b"\xff\xff\xff\xff", ApplyFailed, "undecodable"),
    ]


def test_commands_that_cannot_be_applied_are_recorded_as_failed_and_the_cluster_keeps_serving(
        mixed: Mixed) -> None:
    mixed.make_local_leader()
    leader = stubs(mixed.cluster.grpc_address(LOCAL))
    try:
        leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="t")), timeout=30)
        leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="x" * 245)),
                                 timeout=30)
        group = leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="t", group="g"), timeout=30)
        assert group.group == "g"
        publish_canary(leader, "t", b"before")
        for command, error, words in poison_commands("t"):
            result = mixed.submit_raw(command)
            assert isinstance(result, Rejected) and isinstance(result.error, error), result
            assert words in str(result.error)
            # the log moves on: a canary commits and every node applies past the failed command
            offset = publish_canary(leader, "t", b"after %s" % words.encode())
            target = max(mixed.applied())

            def applied_past(t: int = target) -> bool:
                return min(mixed.applied()) >= t

            wait_until(applied_past, 60, "every node to apply past the command")
        # every node holds the same records, and no group or topic came out of the failed commands
        for i in range(3):
            values = contents(mixed.cluster.grpc_address(i), "t")
            assert values[-1] == b"after undecodable" and len(values) == offset + 1
            s = stubs(mixed.cluster.grpc_address(i))
            try:
                names = [t.config.name for t in s.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=30).topics]
                assert not any("\n" in n or n.startswith("x" * 245 + ".") for n in names), names
            finally:
                s.close()
        # every node counted the same failures, by kind (raftbroker_apply_failures_total)
        kinds = {"append": 1, "group_settle": 1, "undecodable": 1}
        for i in range(3):
            text = scrape(mixed.cluster.metrics_address(i))
            counted = {kind: sample(text, "raftbroker_apply_failures_total", command=kind) for kind in kinds}
            assert counted == kinds, f"node {i} counted {counted}"
        # a node that rebuilds its store from the Raft log replays the failed commands the same way
        mixed.cluster.kill(0, signal.SIGKILL)
        shutil.rmtree(mixed.cluster.node_data_dir(0) / "store")
        publish_canary(leader, "t", b"while n1 is down")
        mixed.cluster.spawn(0)
        target = max(mixed.applied())
        wait_until(lambda: min(mixed.applied()) >= target, 90, "the rebuilt node to catch up")
        assert contents(mixed.cluster.grpc_address(0), "t") == contents(mixed.cluster.grpc_address(LOCAL), "t")
    finally:
        leader.close()


def test_a_command_of_a_newer_format_halts_the_nodes_whose_code_cannot_apply_it(
        mixed: Mixed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rolling upgrade (docs/design/command-formats.md): the in-process node runs code one command
    format newer than the two processes and leads. A command of that format commits (the others
    append it before they apply it); the older nodes halt before it, recording nothing, instead of
    failing it at the apply wall while the newer node applies it."""
    mixed.make_local_leader()
    newer = formats.APPLY_FORMAT + 1
    monkeypatch.setattr(formats, "APPLY_FORMAT", newer)  # this process only: the in-process node
    leader = stubs(mixed.cluster.grpc_address(LOCAL))
    try:
        leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="t")), timeout=30)
        publish_canary(leader, "t", b"before")
        config = K.TopicConfig(name="fmt", partitions=1, durability=K.DURABILITY_DISK)
        mixed.submit_raw(K.Command(create_topic=K.CreateTopicCommand(config=config, now_ms=1),
                                   format=newer).SerializeToString())
        assert mixed.node is not None and mixed.node.state.topic("fmt") is not None, "the newer node applied it"
        for i in range(2):
            def halted(i: int = i) -> bool:
                return sample(scrape(mixed.cluster.metrics_address(i)), "raftbroker_raft_halted") == 1

            wait_until(halted, 60, f"node {i} to halt before the command")
            assert sample(scrape(mixed.cluster.metrics_address(i)), "raftbroker_apply_failures_total",
                          command="create_topic") == 0, "nothing recorded as failed (every kind is exported at 0)"
            s = stubs(mixed.cluster.grpc_address(i))
            try:
                names = [t.config.name for t in s.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=30).topics]
            finally:
                s.close()
            assert "t" in names and "fmt" not in names, f"node {i} applied up to the command, not it: {names}"
    finally:
        leader.close()
