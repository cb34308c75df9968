"""NATS JetStream (Debian's nats-server): a 3-node cluster on loopback, one R3 file-storage stream per
workload, driven by nats-py (``publish_async`` pipelining, an ordered push consumer for reads).

NATS 2.9 acknowledges a JetStream publish once a majority has the message in its file store, but it
fsyncs on an interval (2.9 has no "sync always" option), so its guarantee sits between raftbroker's
``disk`` and ``fsync`` classes for power loss and equals ``disk`` for process crashes.

Two variants: ``nats`` publishes plain messages (a retried publish may store a message twice) and
``nats-dedup`` sets a ``Nats-Msg-Id`` header (a uuid4 per message, like the raftbroker SDK's key per
record) so the stream drops duplicates within its window: the like-for-like exactly-once peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import nats
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig

from bench.procs import LOOPBACK, REGISTRY, ManagedProcess, free_ports, port_open, wait_until
from bench.systems.base import ClientTuning, Deployment, DeploymentInfo, Endpoint, NotAvailable, fetch_and_ack

TUNING = ClientTuning(batch_records=1000, inflight_batches=4)  # 4000 = nats-py's default pending limit
WORK_CONSUMER = "bench-workers"
WORK_FETCH = 16  # messages per pull request of the work-queue workload
WORK_FETCH_TIMEOUT_S = 1.0
WORK_ACK_TIMEOUT_S = 10.0


def _version() -> str:
    out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True, timeout=10).stdout
    return out.strip().removeprefix("nats-server: ")


class NatsEndpoint(Endpoint):
    """One nats-py connection to every node (it reconnects by itself)."""

    def __init__(self, nc: nats.NATS, replicas: int, *, dedup: bool = False) -> None:
        self.tuning = TUNING
        self._dedup = dedup
        self._nc = nc
        self._js = nc.jetstream(publish_async_max_pending=TUNING.batch_records * TUNING.inflight_batches)
        self._replicas = replicas

    async def create(self, stream: str) -> None:
        config = StreamConfig(name=stream, subjects=[stream], storage=StorageType.FILE, num_replicas=self._replicas)
        for _ in range(100):  # the meta leader may still be settling right after start or a failover
            try:
                await self._js.add_stream(config)
                return
            except Exception:  # noqa: BLE001 (retry whatever the server answered)
                await asyncio.sleep(0.2)
        await self._js.add_stream(config)

    async def publish(self, stream: str, payloads: Sequence[bytes]) -> None:
        if self._dedup:
            futures = [await self._js.publish_async(stream, p, headers={"Nats-Msg-Id": str(uuid.uuid4())})
                       for p in payloads]
        else:
            futures = [await self._js.publish_async(stream, p) for p in payloads]
        await asyncio.gather(*futures)

    async def consume(self, stream: str, count: int, on_value: Callable[[bytes], None],
                      ready: asyncio.Event | None = None) -> int:
        done = asyncio.Event()
        seen = 0

        async def on_msg(msg: Msg) -> None:
            nonlocal seen
            if seen < count:
                on_value(msg.data)
                seen += 1
                if seen >= count:
                    done.set()

        sub = await self._js.subscribe(stream, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL,
                                       pending_msgs_limit=-1, pending_bytes_limit=-1)
        if ready is not None:
            ready.set()
        try:
            await done.wait()
        finally:
            await sub.unsubscribe()
        return seen

    async def work(self, stream: str, count: int, concurrency: int, on_done: Callable[[bytes], None]) -> None:
        """A durable pull consumer with explicit acks: ``concurrency // WORK_FETCH`` workers, each with its
        own pull subscription to it (nats-py's ``fetch`` is not meant for concurrent calls on one: they
        took each other's replies and stalled for seconds), fetching up to ``WORK_FETCH`` messages and
        acking each with ``ack_sync`` (the server confirms the ack)."""
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=max(concurrency, WORK_FETCH))
        subs = [await self._js.pull_subscribe(stream, durable=WORK_CONSUMER, config=config)
                for _ in range(max(1, concurrency // WORK_FETCH))]

        async def ack(msg: Msg) -> None:
            await msg.ack_sync(timeout=WORK_ACK_TIMEOUT_S)
            on_done(msg.data)

        def fetcher(psub: JetStreamContext.PullSubscription) -> Callable[[int], Awaitable[list[Msg]]]:
            async def fetch(n: int) -> list[Msg]:
                try:
                    return await psub.fetch(n, timeout=WORK_FETCH_TIMEOUT_S)
                except nats.errors.TimeoutError:
                    return []
            return fetch

        try:
            await fetch_and_ack([fetcher(psub) for psub in subs], count, WORK_FETCH, ack)
        finally:
            for psub in subs:
                with contextlib.suppress(Exception):
                    await psub.unsubscribe()

    async def close(self) -> None:
        await self._nc.close()


class NatsDeployment(Deployment):
    """``nodes`` nats-server processes with JetStream, clustered over loopback routes."""

    def __init__(self, nodes: int, workdir: Path, *, dedup: bool = False) -> None:
        if shutil.which("nats-server") is None:
            raise NotAvailable("nats-server is not installed (apt-get install nats-server)")
        self.workdir = workdir  # the caller owns (and removes) it
        self.dedup = dedup
        self.info = DeploymentInfo(
            system="nats", variant=f"JetStream R{nodes} file{' + Nats-Msg-Id' if dedup else ''}", nodes=nodes,
            version=_version(),
            guarantee="ack after a majority stored the message (file store, fsync on an interval)",
            client="nats-py publish_async, 4000 pending; ordered push consumer; work queue: a durable pull "
                   f"consumer, fetches of {WORK_FETCH}, ack_sync per message",
            publish_api="publish_async: one message per protocol frame, acks awaited in groups of 1000, 4000 pending",
            exactly_once="a uuid4 Nats-Msg-Id header per message, deduplicated in the stream's 2 min window"
            if dedup else "",
            notes=["NATS 2.9 acknowledges before fsync (no sync-always option in 2.9)"],
        )
        ports = free_ports(3 * nodes)
        self.client_ports, self.route_ports, self.http_ports = ports[:nodes], ports[nodes:2 * nodes], ports[2 * nodes:]
        self.procs = [self._process(i) for i in range(nodes)]

    def _process(self, i: int) -> ManagedProcess:
        routes = ", ".join(f'"nats-route://{LOOPBACK}:{p}"' for j, p in enumerate(self.route_ports) if j != i)
        store = self.workdir / f"n{i + 1}"
        cluster = (f'cluster {{ name: bench, listen: "{LOOPBACK}:{self.route_ports[i]}", routes: [{routes}] }}'
                   if self.nodes_total > 1 else "")
        conf = self.workdir / f"n{i + 1}.conf"
        conf.write_text(
            f'server_name: n{i + 1}\nlisten: "{LOOPBACK}:{self.client_ports[i]}"\n'
            f'http: "{LOOPBACK}:{self.http_ports[i]}"\n'
            f'jetstream {{ store_dir: "{store}", max_file_store: 20G, max_memory_store: 1G }}\n{cluster}\n'
        )
        return ManagedProcess(f"nats n{i + 1}", ["nats-server", "-c", str(conf)], self.workdir / f"n{i + 1}.log")

    @property
    def nodes_total(self) -> int:
        return len(self.client_ports)

    @property
    def urls(self) -> list[str]:
        return [f"nats://{LOOPBACK}:{p}" for p in self.client_ports]

    def start(self) -> None:
        REGISTRY.add(self)
        for proc in self.procs:
            proc.start()
        for port, proc in zip(self.client_ports, self.procs, strict=True):
            wait_until(functools.partial(port_open, port), 30.0, proc.name, watch=self.procs)
        wait_until(self._jetstream_ready, 60.0, "JetStream meta leader", watch=self.procs)

    def _jetstream_ready(self) -> bool:
        for port in self.http_ports:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/healthz?js-enabled-only=true", timeout=1) as r:
                if r.status != 200:
                    return False
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.http_ports[0]}/jsz", timeout=1) as r:
            meta = json.load(r).get("meta_cluster", {})
        return self.nodes_total == 1 or bool(meta.get("leader"))

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()
        REGISTRY.discard(self)

    async def endpoint(self) -> Endpoint:
        nc = await nats.connect(self.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.05,
                                connect_timeout=2, allow_reconnect=True)
        return NatsEndpoint(nc, self.nodes_total, dedup=self.dedup)

    def server_pgids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None and p.alive()]

    async def leader_node(self, stream: str) -> int:
        nc = await nats.connect(self.urls)
        try:
            info = await nc.jetstream().stream_info(stream)
        finally:
            await nc.close()
        name = info.cluster.leader if info.cluster is not None else "n1"
        assert name is not None and name.startswith("n"), f"unexpected stream leader {name!r}"
        return int(name[1:]) - 1

    def kill_node(self, i: int) -> None:
        self.procs[i].kill9()

    def spawn_node(self, i: int) -> None:
        self.procs[i].start()

    async def node_holds(self, i: int, stream: str, records: int) -> bool:
        return await asyncio.to_thread(self._local_messages, i, stream, records)

    def _local_messages(self, i: int, stream: str, records: int) -> bool:
        """Node ``i``'s own monitoring view: JetStream healthy and its replica of ``stream`` complete."""
        url = f"http://{LOOPBACK}:{self.http_ports[i]}/jsz?streams=true"
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                jsz = json.load(r)
        except OSError:
            return False
        for account in jsz.get("account_details") or []:
            for s in account.get("stream_detail") or []:
                if s.get("name") == stream and int(s.get("state", {}).get("messages", 0)) >= records:
                    return True
        return False

