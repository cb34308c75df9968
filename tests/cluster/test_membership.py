"""Membership (SPEC §5, §8): grow a cluster from 3 to 5 nodes and shrink it back to 3 while the SDK
publishes; new nodes catch up through a snapshot, every node learns every member's gRPC address
(followers name an added leader in x-leader), and nothing acknowledged is lost."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import grpc
import pytest

from broker.client import BrokerError, Client, FailedPrecondition, MemberNotFound
from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2
from tests.cluster.digests import digest, partition_contents, wait_converged
from tests.cluster.stubs import stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster]

TOPIC = "members"


class Publisher:
    """One SDK client publishing numbered batches until stopped; remembers what was acknowledged."""

    def __init__(self, client: Client) -> None:
        self.acked: list[bytes] = []
        self.cancelled = 0
        self.error: BaseException | None = None
        self._client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        b = 0
        try:
            while not self._stop.is_set():
                values = [b"%d-%d" % (b, i) for i in range(20)]
                batch = [{"value": v, "partition": 0, "idempotency_key": v.decode()} for v in values]
                try:
                    self._client.publish_batch(TOPIC, batch)
                except BrokerError as err:
                    # A leader stopped with SIGTERM cancels the calls in flight and the SDK reports
                    # CANCELLED (it retries only UNAVAILABLE and deadlines): retry, same keys.
                    if err.code != "CANCELLED":
                        raise
                    self.cancelled += 1
                    continue
                self.acked.extend(values)
                b += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def wait_for_more(self, n: int = 200) -> None:
        target = len(self.acked) + n
        wait_until(lambda: len(self.acked) >= target or self.error, 60, "the publisher to go on")
        assert self.error is None, self.error


def members(c: DevCluster, i: int) -> dict[str, str]:
    """Node ``i``'s view of the members: id -> gRPC address."""
    s = stubs(c.grpc_address(i))
    try:
        status = s.admin.ClusterStatus(admin_pb2.ClusterStatusRequest(), timeout=10)
        return {n.id: n.grpc_address for n in status.nodes}
    finally:
        s.close()


def caught_up(c: DevCluster, i: int) -> bool:
    leader = c.leader()
    if leader is None:
        return False
    mine, theirs = c.node_status(i), c.node_status(leader)
    return mine is not None and theirs is not None and mine.applied_index >= theirs.commit_index - 50


def lead_from(c: DevCluster, candidates: set[int]) -> int:
    """Stop leaders gracefully (each hands over) until one of ``candidates`` leads; return it."""
    for _ in range(8):
        leader = c.leader()
        if leader in candidates:
            return leader
        assert leader is not None
        c.kill(leader, signal.SIGTERM)

        def handed_over(old: int = leader) -> bool:
            return c.leader() not in (None, old)

        def rejoined(old: int = leader) -> bool:
            return c.leader() is not None and caught_up(c, old)

        wait_until(handed_over, 30, "the handover")
        c.spawn(leader)
        wait_until(rejoined, 60, "the old leader to rejoin")
    raise AssertionError(f"none of {candidates} came to lead")


def x_leader_from(c: DevCluster, follower: int) -> str:
    """What a follower tells a writer: the leader's gRPC address in x-leader."""
    s = stubs(c.grpc_address(follower))
    try:
        request = broker_pb2.PublishRequest(topic=TOPIC, records=[broker_pb2.PublishRecord(value=b"x")])
        with pytest.raises(grpc.RpcError) as info:
            s.broker.Publish(request, timeout=10)
        return dict(info.value.trailing_metadata() or ()).get("x-leader", "")
    finally:
        s.close()


@pytest.mark.timeout(300)
def test_grow_to_five_and_shrink_to_three_while_publishing(tmp_path: Path) -> None:
    # small compaction thresholds (the leader: at most 4 x 1.5 x 30 entries): new nodes catch up through a snapshot
    env = dict(os.environ, RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES="30")
    c = DevCluster(3, tmp_path, env=env).start()
    try:
        c.wait_ready(60)
        with Client(c.addresses, retry_deadline_s=60) as client:
            client.create_topic(TOPIC)
            with Publisher(client) as publisher:
                publisher.wait_for_more(5000)  # > 200 entries: the leader has compacted
                # a node that is not running is refused (it would count in the majority all the same)
                i = c.nodes
                with pytest.raises(FailedPrecondition, match=f"node '{c.node_id(i)}' does not answer at "
                                                         f"{c.grpc_address(i)}.*start it first"):
                    client.add_node(c.node_id(i), c.raft_address(i), c.grpc_address(i))
                assert set(members(c, c.leader() or 0)) == {c.node_id(j) for j in range(3)}
                added = []
                for _ in range(2):
                    i = c.add_node()
                    client.add_node(c.node_id(i), c.raft_address(i), c.grpc_address(i))
                    client.add_node(c.node_id(i), c.raft_address(i), c.grpc_address(i))  # idempotent

                    def joined(i: int = i) -> bool:
                        return caught_up(c, i)

                    wait_until(joined, 60, f"{c.node_id(i)} to catch up")
                    added.append(i)
                    publisher.wait_for_more()
                expected = {c.node_id(i): c.grpc_address(i) for i in range(5)}
                for i in range(5):
                    assert members(c, i) == expected, f"{c.node_id(i)} does not know every member"
                assert all("restored snapshot" in c.log_path(i).read_text() for i in added), \
                    "an added node did not catch up through a snapshot"
                with pytest.raises(MemberNotFound, match="not a member"):
                    client.remove_node("n9")

                new_leader = lead_from(c, set(added))  # an added node leads: old nodes must name it
                publisher.wait_for_more()
                for i in set(range(5)) - {new_leader}:
                    assert x_leader_from(c, i) == c.grpc_address(new_leader)
                    assert c.node_status(i).leader_id == c.node_id(new_leader)  # type: ignore[union-attr]

                removed = [new_leader, 0]  # the leader itself (it hands over first) and an original node
                for i in removed:
                    client.remove_node(c.node_id(i))
                    c.kill(i)
                    wait_until(lambda: c.leader() is not None, 30, "a leader of the remaining nodes")
                    publisher.wait_for_more()
                remaining = sorted(set(range(5)) - set(removed))
                for i in remaining:
                    assert set(members(c, i)) == {c.node_id(j) for j in remaining}
            assert publisher.error is None, publisher.error
        wait_converged(c)
        contents = [partition_contents(c.grpc_address(i), TOPIC, 0) for i in remaining]
        assert len({digest(x) for x in contents}) == 1, "replicas differ"
        stored = [v for _, v in contents[0]]
        assert len(stored) == len(set(stored)), "a record was stored twice"
        positions = {v: k for k, v in enumerate(stored)}
        missing = [v for v in publisher.acked if v not in positions]
        assert not missing, f"{len(missing)} acknowledged records lost"
        order = [positions[v] for v in publisher.acked]
        assert order == sorted(order), "acknowledged records out of order"
        print(f"{len(publisher.acked)} records acknowledged through 2 additions and 2 removals "
              f"({publisher.cancelled} publishes cancelled by a stopping leader and retried)")
    finally:
        c.stop()
