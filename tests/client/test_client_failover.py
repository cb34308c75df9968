"""The SDK rides through a leader kill -9: publishes retry, subscriptions resume (own cluster)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Batch, Client, Record, Unavailable
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def every_node_back(killable: DevCluster) -> Iterator[None]:
    """After each test, every node of the shared cluster alive again, whatever the test did: a test
    that fails after a kill must not leave the next one a cluster without a quorum."""
    yield
    dead = [i for i in range(killable.nodes) if not killable.alive(i)]
    for i in dead:
        killable.spawn(i)
    if dead:
        wait_until(lambda: killable.leader() is not None, 60, "every node to agree on a leader")


def kill_leader(c: DevCluster) -> int:
    c.wait_ready(60)
    index = c.leader()
    assert index is not None
    c.kill(index)
    return index


def heal(c: DevCluster, index: int) -> None:
    c.spawn(index)
    wait_until(lambda: c.leader() is not None, 60, "every node to agree on a leader")


def stored_values(client: Client, topic: str) -> list[bytes]:
    return [r.value for r in client.subscribe(topic, stop_at_end=True) if isinstance(r, Record)]


def test_publish_keeps_working_across_a_leader_kill(killable: DevCluster, tmp_path: Path) -> None:
    with Client(killable.addresses, retry_deadline_s=60) as client:
        client.create_topic("fo-pub", 1)
        acked = []
        killed = None
        for i in range(60):
            if i == 20:
                killed = kill_leader(killable)
            value = f"m{i}".encode()
            client.publish("fo-pub", value)
            acked.append(value)
        assert killed is not None
        assert client.leader != killable.grpc_address(killed)
        stored = stored_values(client, "fo-pub")
        assert stored == acked, "every acknowledged record stored once, in publish order (retries reuse keys)"
    heal(killable, killed)


def test_subscription_resumes_after_the_leader_dies(killable: DevCluster) -> None:
    with Client(killable.addresses, retry_deadline_s=60) as client:
        client.create_topic("fo-sub", 2)
        got: list[Record] = []
        sub = client.subscribe("fo-sub", start=0)
        reader = threading.Thread(target=lambda: got.extend(r for r in sub if isinstance(r, Record)),
                                  daemon=True)
        reader.start()
        client.publish_batch("fo-sub", [{"value": f"a{i}", "partition": i % 2} for i in range(10)])
        wait_until(lambda: len(got) >= 10, 20, "the first records")
        killed = kill_leader(killable)
        client.publish_batch("fo-sub", [{"value": f"b{i}", "partition": i % 2} for i in range(10)])
        wait_until(lambda: len(got) >= 20, 60, "the records published after the kill")
        sub.close()
        reader.join(10)
        values = [r.value.decode() for r in got]
        assert sorted(values) == sorted([f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)])
        for p in (0, 1):
            offsets = [r.offset for r in got if r.partition == p]
            assert offsets == list(range(10)), f"partition {p}: no loss, no repeat, in order"
    heal(killable, killed)


def test_a_batch_subscription_resumes_after_the_leader_dies(killable: DevCluster) -> None:
    with Client(killable.addresses, retry_deadline_s=60) as client:
        client.create_topic("fo-bat", 2)
        got: list[tuple[int, int, bytes]] = []
        sub = client.subscribe_batches("fo-bat", start=0)
        reader = threading.Thread(target=lambda: got.extend(
            (b.partition, o, v) for b in sub if isinstance(b, Batch) for o, v in zip(b.offsets, b.values, strict=True)),
            daemon=True)
        reader.start()
        client.publish_batch("fo-bat", [{"value": f"a{i}", "partition": i % 2} for i in range(10)])
        wait_until(lambda: len(got) >= 10, 20, "the first records")
        killed = kill_leader(killable)
        client.publish_batch("fo-bat", [{"value": f"b{i}", "partition": i % 2} for i in range(10)])
        wait_until(lambda: len(got) >= 20, 60, "the records published after the kill")
        sub.close()
        reader.join(10)
        want = [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)]
        assert sorted(v.decode() for _, _, v in got) == sorted(want)
        for p in (0, 1):
            assert [o for q, o, _ in got if q == p] == list(range(10)), f"partition {p}: no loss, no repeat, in order"
    heal(killable, killed)


def test_a_client_bootstrapped_with_the_leader_alone_survives_its_death(killable: DevCluster) -> None:
    leader = killable.wait_ready(60)
    with Client([leader], retry_deadline_s=60) as client:
        client.create_topic("fo-one", 1)
        wait_until(lambda: len(client.known_addresses) >= killable.nodes, 10,
                   "the client to learn every node from the cluster")
        killed = kill_leader(killable)
        assert killable.grpc_address(killed) == leader
        assert client.publish("fo-one", "after").offset == 0
        assert client.leader != leader
    heal(killable, killed)


def test_no_quorum_raises_unavailable_within_the_retry_deadline(killable: DevCluster) -> None:
    leader = killable.wait_ready(60)
    followers = [i for i in range(killable.nodes) if killable.grpc_address(i) != leader]
    with Client(killable.addresses, timeout_s=2, retry_deadline_s=3) as client:
        client.create_topic("fo-quorum", 1)
        for i in followers:
            killable.kill(i)
        started = time.monotonic()
        with pytest.raises(Unavailable) as info:
            client.publish("fo-quorum", "lost")
        assert time.monotonic() - started < 3 + 2 + 5, "bounded by the retry deadline plus one attempt"
        assert info.value.code == "UNAVAILABLE"
    for i in followers:
        killable.spawn(i)
    wait_until(lambda: killable.leader() is not None, 60, "a leader once the quorum is back")
