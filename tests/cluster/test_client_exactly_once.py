"""Exactly-once publishing through the SDK across 20 leader kills in one run (SPEC §4, §9).

One client publishes from one thread, batch after batch, while another thread kill -9s the
current leader 20 times (each time: wait until a new leader is agreed, respawn the killed node,
wait until all three agree again, let the publisher make progress, kill again). The SDK publishes
as it does by default, in a producer session (one ``(dedup_id, first_msg_id)`` range per batch), and
retries every interrupted publish with the same range, so afterwards each acknowledged record is
stored exactly once, in publish order per partition, at the place its result named, with
contiguous offsets, and every node holds identical partitions. The test watches the requests the
SDK sends (the real stubs, observed) to prove the run did retry session batches.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from typing import Any

import pytest

from broker.client import Client, PublishResult
from broker.devcluster import DevCluster
from broker.v1 import broker_pb2
from tests.cluster.digests import digest, partition_contents, wait_converged
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]  # ~4 min quiet; 7+ under a load of 13

KILLS = 20
PARTITIONS = 3
BATCH = 20
BATCHES_BETWEEN_KILLS = 2  # acknowledged batches the publisher must make between two kills
TOPIC = "exactly-once"


class Killer(threading.Thread):
    """Kills the leader ``KILLS`` times, each time once the publisher has made progress."""

    def __init__(self, cluster: DevCluster, acked_batches: list[int]) -> None:
        super().__init__(name="leader-killer", daemon=True)
        self.cluster = cluster
        self.acked_batches = acked_batches  # [count], written by the publisher
        self.kills: list[tuple[str, float]] = []  # (killed node, seconds until a new leader)
        self.error: BaseException | None = None
        self.done = threading.Event()

    def _reached(self, batches: int) -> bool:
        return self.acked_batches[0] >= batches

    def run(self) -> None:
        try:
            for _ in range(KILLS):
                target = self.acked_batches[0] + BATCHES_BETWEEN_KILLS
                wait_until(functools.partial(self._reached, target), 120, "the publisher to make progress")
                self.cluster.wait_ready(60)
                leader = self.cluster.leader()
                assert leader is not None
                self.cluster.kill(leader)
                killed_at = time.monotonic()
                wait_until(lambda: self.cluster.leader() is not None, 60, "a new leader among the survivors")
                self.kills.append((self.cluster.node_id(leader), time.monotonic() - killed_at))
                self.cluster.spawn(leader)
            self.cluster.wait_ready(60)
        except BaseException as err:  # reported by the test thread
            self.error = err
        finally:
            self.done.set()


def test_twenty_leader_kills_during_one_publish_run_store_each_record_once(fresh_cluster: DevCluster) -> None:
    c = fresh_cluster
    acked: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    places: list[tuple[PublishResult, bytes]] = []
    acked_batches = [0]
    killer = Killer(c, acked_batches)
    started = time.monotonic()
    with Client(c.addresses, timeout_s=5, retry_deadline_s=90) as client:
        client.create_topic(TOPIC, PARTITIONS)
        attempts = watch_publishes(client)
        killer.start()
        batch_no = 0
        while True:  # until the killer is done (then one more batch, published after its last respawn)
            values = [b"b%d-r%d" % (batch_no, i) for i in range(BATCH)]
            partitions = [(batch_no * BATCH + i) % PARTITIONS for i in range(BATCH)]
            results = client.publish_batch(
                TOPIC, [{"value": v, "partition": p} for v, p in zip(values, partitions, strict=True)])
            assert [r.partition for r in results] == partitions
            for value, partition, result in zip(values, partitions, results, strict=True):
                acked[partition].append(value)
                places.append((result, value))
            batch_no += 1
            acked_batches[0] = batch_no
            if killer.done.is_set():
                break
        publish_s = time.monotonic() - started
    killer.join(10)
    if killer.error is not None:
        raise killer.error
    assert len(killer.kills) == KILLS

    wait_converged(c)
    per_node = {i: [partition_contents(c.grpc_address(i), TOPIC, p) for p in range(PARTITIONS)]
                for i in range(c.nodes)}
    for p in range(PARTITIONS):
        digests = {c.node_id(i): digest(per_node[i][p]) for i in per_node}
        assert len(set(digests.values())) == 1, f"replicas differ on partition {p}: {digests}"
        contents = per_node[0][p]
        assert [o for o, _ in contents] == list(range(len(contents))), f"partition {p}: offsets contiguous from 0"
        stored = [v for _, v in contents]
        lost = set(acked[p]) - set(stored)
        assert not lost, f"partition {p}: {len(lost)} acknowledged records lost"
        twice = len(stored) - len(set(stored))
        assert not twice, f"partition {p}: {twice} records stored more than once"
        assert stored == acked[p], f"partition {p}: stored records differ from the publish order"
    stored_at = {(p, o): v for p in range(PARTITIONS) for o, v in per_node[0][p]}
    wrong = [(r, v) for r, v in places if stored_at.get((r.partition, r.offset)) != v]
    assert not wrong, f"{len(wrong)} results name a place that holds another record, e.g. {wrong[0]}"

    sent = collections.Counter((r.dedup_id, r.first_msg_id, len(r.records) + len(r.packed_records))
                               for r in attempts)
    assert all(first > 0 and dedup_id.startswith("sdk-") for dedup_id, first, _ in sent), (
        "every batch went as a range of an SDK producer session")
    assert len(sent) == batch_no, "one session range per batch, resent unchanged by every retry"
    retried = sum(1 for n in sent.values() if n > 1)
    assert retried, "the leader kills made the SDK resend some session batches"
    with Client(c.addresses) as reader:
        marks = {m.dedup_id: m.msg_id for m in reader.get_watermarks(TOPIC)}
    assert sum(marks.values()) == len(places), "the sessions' watermarks count every record once"

    duplicates = sum(r.duplicate for r, _ in places)
    elections = ", ".join(f"{node} {s:.1f}s" for node, s in killer.kills)
    print(f"\n{batch_no} batches ({len(places)} records) in {publish_s:.1f}s across {KILLS} leader kills; "
          f"{retried} session batches sent more than once ({sum(sent.values())} attempts); "
          f"{duplicates} records answered as duplicates of a lost attempt; new leader after: {elections}")


def watch_publishes(client: Client) -> list[broker_pb2.PublishRequest]:
    """Every Publish request the client sends, in order (each attempt of each call), recorded on
    its way to the real stub."""
    sent: list[broker_pb2.PublishRequest] = []
    router = client._router
    real = router.publisher

    class Observed:
        def __init__(self, stub: Any) -> None:
            self._stub = stub

        def Publish(self, data: bytes, **kwargs: Any) -> Any:  # noqa: N802 - gRPC's name
            sent.append(broker_pb2.PublishRequest.FromString(data))
            return self._stub.Publish(data, **kwargs)

    router.publisher = lambda address: Observed(real(address))  # type: ignore[method-assign,assignment,return-value]
    return sent
