"""raftbroker as the benchmark runs it: a :class:`~broker.devcluster.DevCluster` of 1 or 3 nodes, topics of
one durability class, driven through the public asyncio SDK (:class:`broker.client.aio.AsyncClient`) on
the workloads' event loop, as nats-py, aio-pika and redis-py's asyncio client drive the peers. Until
2026-11-29 it drove the synchronous SDK through a thread pool: every call then paid a hop to a pool
thread and back, and the asyncio SDK measured 10-20 % more 1 KiB msg/s and 20 % lower ack p50 (disk-3)
in the same runs (bench/NOTE.md). Every batch goes as one range of an SDK producer session
(exactly-once in effect: one check and one write per batch on every replica), which the peers' fast
paths do not do.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.procs import REGISTRY
from bench.systems.base import ClientTuning, Deployment, DeploymentInfo, Endpoint, NotAvailable
from broker.allocator import ENV as ALLOCATOR_ENV
from broker.allocator import loaded_jemalloc
from broker.client import Batch, Client, Unimplemented
from broker.client.aio import AsyncClient, AsyncMessage
from broker.devcluster import DevCluster

TUNING = ClientTuning(batch_records=1000, inflight_batches=4)
# records per consume response asked for (the server also bounds a response at 1 MiB): a Kafka
# consumer fetches up to 1 MiB per partition by default too
CONSUME_BATCH_RECORDS = 5000
MAX_IN_FLIGHT = 1000  # publish calls at once: failover keeps a few hundred waiting in the SDK's retry loop
WORK_GROUP = "bench-workers"
_GUARANTEE = {
    "disk": "ack after a Raft majority has the batch (OS-buffered, not fsynced)",
    "fsync": "ack after a Raft majority has fsynced the batch",
}


def _version() -> str:
    """``0.1.0 (<commit>)``, with ``+uncommitted`` when the measured ``broker/`` differs from that commit."""
    repo = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=repo, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "broker", "proto"], capture_output=True,
                               text=True, cwd=repo, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, dirty = "", ""
    if not sha:
        return "0.1.0"
    return f"0.1.0 ({sha}{'+uncommitted' if dirty else ''})"


class RaftbrokerEndpoint(Endpoint):
    """The asyncio SDK (:class:`~broker.client.aio.AsyncClient`) on the workload's event loop;
    ``durability`` is the class of the topics it creates."""

    def __init__(self, addresses: Sequence[str], durability: str) -> None:
        self.tuning = TUNING
        self._durability = durability
        self._client = AsyncClient(list(addresses), timeout_s=2.0, retry_deadline_s=30.0,
                                   max_in_flight_batches=MAX_IN_FLIGHT)

    async def create(self, stream: str) -> None:
        try:
            await self._client.create_topic(stream, 1, durability=self._durability)
        except Unimplemented as err:
            raise NotAvailable(f"durability class {self._durability!r}: not available yet ({err})") from err

    async def publish(self, stream: str, payloads: Sequence[bytes]) -> None:
        await self._client.publish_batch(stream, payloads)

    async def publish_one(self, stream: str, payload: bytes) -> None:
        """The SDK's ``publish`` coalesces concurrent calls (one request in flight per topic)."""
        await self._client.publish(stream, payload)

    async def consume(self, stream: str, count: int, on_value: Callable[[bytes], None],
                      ready: asyncio.Event | None = None) -> int:
        seen = 0
        async with self._client.subscribe_batches(stream, start="earliest", max_batch=CONSUME_BATCH_RECORDS) as sub:
            if ready is not None:
                ready.set()
            async for item in sub:
                if isinstance(item, Batch):
                    for value in item.values[:count - seen]:
                        on_value(value)
                    seen += min(len(item), count - seen)
                    if seen >= count:
                        break
        return seen

    async def work(self, stream: str, count: int, concurrency: int, on_done: Callable[[bytes], None]) -> None:
        """A queue group drained by :meth:`AsyncClient.run`: the handler acks its own message (the SDK's
        concurrent acks share ``Ack`` calls) and counts it once the ack is replicated."""

        async def handler(message: AsyncMessage) -> None:
            await message.ack()
            on_done(message.value)

        await self._client.run(stream, group=WORK_GROUP, handler=handler, concurrency=concurrency, limit=count,
                               mode="queue")

    async def close(self) -> None:
        await self._client.close()


class RaftbrokerDeployment(Deployment):
    """``nodes`` raftbroker processes; every topic the endpoint creates has class ``durability``."""

    def __init__(self, nodes: int, durability: str, workdir: Path) -> None:
        assert durability in _GUARANTEE and nodes >= 1
        self.durability = durability
        self.workdir = workdir  # the caller owns (and removes) it
        self.info = DeploymentInfo(
            system="raftbroker", variant=f"{durability}-{nodes}", nodes=nodes, version=_version(),
            guarantee=_GUARANTEE[durability],
            client="raftbroker asyncio SDK (AsyncClient) publish_batch(1000), 4 in flight; "
                   f"subscribe_batches(max_batch={CONSUME_BATCH_RECORDS}, the server's 2 MiB bound): one object per "
                   "batch; work queue: AsyncClient.run over a queue group, the handler acks its message "
                   "(concurrent acks share Ack calls)",
            publish_api="publish_batch: one gRPC request of 1000 records, 4 requests in flight; latency: "
                        "publish() per record, concurrent calls coalesced by the SDK, 1 request in flight "
                        "(on a PublishStream)",
            exactly_once="SDK default: a producer session, one (dedup_id, first_msg_id) range per batch",
        )
        self.cluster = DevCluster(nodes, self.workdir / "cluster")
        self._started = False

    def start(self) -> None:
        REGISTRY.add(self)
        self.cluster.start()
        self._started = True
        self.cluster.wait_ready(60.0)
        pid = self.cluster.pids[0]
        if pid is not None and not any(n.startswith("nodes' allocator") for n in self.info.notes):  # once
            nodes = "jemalloc" if loaded_jemalloc(Path(f"/proc/{pid}/maps").read_text()) else "glibc malloc"
            own = "jemalloc" if loaded_jemalloc() else "glibc malloc"
            mode = os.environ.get(ALLOCATOR_ENV, "auto")
            self.info.notes.append(f"nodes' allocator: {nodes} (serve --allocator {mode}), "
                                   f"the client process's: {own}")
        probe = f"bench-probe-{self.durability}"
        with Client(self.cluster.addresses, timeout_s=5.0, retry_deadline_s=30.0) as client:
            try:
                client.create_topic(probe, 1, durability=self.durability)
            except Unimplemented as err:
                raise NotAvailable(f"the {self.durability!r} durability class is not available yet "
                                   f"(CreateTopic answered UNIMPLEMENTED: {err})") from err
            client.drop_topic(probe)

    def stop(self) -> None:
        if self._started:
            self.cluster.stop()
            self._started = False
        REGISTRY.discard(self)

    async def endpoint(self) -> Endpoint:
        return RaftbrokerEndpoint(self.cluster.addresses, self.durability)

    def server_pgids(self) -> list[int]:
        return [pid for i, pid in enumerate(self.cluster.pids) if pid is not None and self.cluster.alive(i)]

    async def leader_node(self, stream: str) -> int:
        leader = await asyncio.to_thread(self._agreed_leader)
        return leader

    def _agreed_leader(self) -> int:
        self.cluster.wait_ready(30.0)
        leader = self.cluster.leader()
        if leader is None:
            raise RuntimeError("the cluster lost its leader again")
        return leader

    def kill_node(self, i: int) -> None:
        self.cluster.kill(i)

    def spawn_node(self, i: int) -> None:
        self.cluster.spawn(i)

    async def node_holds(self, i: int, stream: str, records: int) -> bool:
        return await asyncio.to_thread(self._caught_up, i, stream, records)

    def _caught_up(self, i: int, stream: str, records: int) -> bool:
        """Node ``i`` answers, knows the leader, and has applied everything the others have committed
        (a single node: it leads and its topic holds ``records``)."""
        mine = self.cluster.node_status(i)
        if mine is None or not mine.leader_id:
            return False
        if self.nodes == 1:
            with Client([self.cluster.grpc_address(i)], timeout_s=2.0, retry_deadline_s=0.0) as client:
                return sum(p.end_offset for p in client.describe_topic(stream).partitions) >= records
        others = [self.cluster.node_status(j) for j in range(self.nodes) if j != i and self.cluster.alive(j)]
        target = max([o.commit_index for o in others if o is not None] + [mine.commit_index])
        return mine.applied_index >= target > 0

