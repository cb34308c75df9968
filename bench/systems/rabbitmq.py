"""RabbitMQ (Debian's rabbitmq-server): a 3-node cluster on loopback (its own epmd on a free port, nodes
found by classic config), one durable quorum queue or stream per workload, publisher confirms,
driven by aio-pika.

Both variants share one cluster (:class:`RabbitCluster`): starting three Erlang VMs twice would cost
half a minute of the time budget. A quorum queue's leader is placed on the node the declaring
client is connected to; that client is what failover kills, so the client must move like a
raftbroker client must (see :meth:`RabbitEndpoint.recover`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench.procs import LOOPBACK, REGISTRY, ManagedProcess, free_ports, port_open, wait_until
from bench.systems.base import ClientTuning, Deployment, DeploymentInfo, Endpoint, NotAvailable

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
USER = "rabbitmq"
TUNING = ClientTuning(batch_records=1000, inflight_batches=2)
STREAM_ACK_EVERY = 500
CHANNEL_REOPEN_S = 0.2
CREATE_RETRY_S = 30.0
_ERL_ARGS = "+sbwt none +sbwtdcpu none +sbwtdio none"  # no busy-waiting schedulers on a shared 2-core box


def _version() -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"], capture_output=True,
                         text=True, timeout=10).stdout
    return out.split("-")[0] or "unknown"


class RabbitCluster:
    """``nodes`` RabbitMQ nodes plus the epmd they register with; every process run as user rabbitmq."""

    def __init__(self, nodes: int, workdir: Path) -> None:
        if not Path(SERVER).exists() or shutil.which("epmd") is None:
            raise NotAvailable("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        self.workdir = workdir  # the caller owns (and removes) it
        blocked = [p for p in self.workdir.resolve().parents if not p.stat().st_mode & 0o001]
        if blocked:
            raise NotAvailable(f"RabbitMQ runs as user {USER}, who cannot enter {blocked[0]} (mode "
                               f"{oct(blocked[0].stat().st_mode & 0o777)}); use a work directory others may traverse")
        self.nodes = nodes
        ports = free_ports(2 * nodes + 1)
        self.epmd_port, self.amqp_ports, self.dist_ports = ports[0], ports[1:nodes + 1], ports[nodes + 1:]
        self.names = [f"rabbit{i + 1}@localhost" for i in range(nodes)]
        (self.workdir / "home").mkdir(parents=True, exist_ok=True)
        cookie = self.workdir / "home" / ".erlang.cookie"
        cookie.write_text(os.urandom(16).hex())
        cookie.chmod(0o400)
        self.epmd = ManagedProcess("epmd", ["epmd", "-port", str(self.epmd_port), "-address", LOOPBACK],
                                   self.workdir / "epmd.log", user=USER, env=self._base_env())
        self.procs = [self._node(i) for i in range(nodes)]
        shutil.chown(self.workdir, USER, USER)
        for path in self.workdir.rglob("*"):
            shutil.chown(path, USER, USER)
        self.started = False
        self.failed: str | None = None

    def _base_env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir / "home"),
                "LANG": "C.UTF-8", "ERL_EPMD_PORT": str(self.epmd_port), "ERL_EPMD_ADDRESS": LOOPBACK}

    def _node(self, i: int) -> ManagedProcess:
        base = self.workdir / f"n{i + 1}"
        base.mkdir(parents=True, exist_ok=True)
        peers = "\n".join(f"cluster_formation.classic_config.nodes.{j + 1} = {n}" for j, n in enumerate(self.names))
        conf = base / "rabbitmq.conf"
        conf.write_text(
            f"listeners.tcp.1 = {LOOPBACK}:{self.amqp_ports[i]}\n"
            "cluster_formation.peer_discovery_backend = classic_config\n"
            f"{peers}\n"
            "disk_free_limit.absolute = 50MB\n"
            "log.console = false\nlog.file.level = warning\n"
        )
        (base / "enabled_plugins").write_text("[].\n")
        env = self._base_env() | {
            "RABBITMQ_NODENAME": self.names[i], "RABBITMQ_NODE_IP_ADDRESS": LOOPBACK,
            "RABBITMQ_NODE_PORT": str(self.amqp_ports[i]), "RABBITMQ_DIST_PORT": str(self.dist_ports[i]),
            "RABBITMQ_CONFIG_FILE": str(conf), "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"), "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(base / "pid"), "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": _ERL_ARGS,
            "RUNNING_UNDER_SYSTEMD": "1",  # the script then execs the VM: our PID is the VM's
        }
        return ManagedProcess(f"rabbitmq n{i + 1}", [SERVER], self.workdir / f"n{i + 1}.log", env=env, user=USER,
                              cwd=base)

    def start(self) -> None:
        """Start epmd and every node and wait for the cluster; a failure stops them and is remembered, so a
        second variant on this cluster fails at once with the same reason."""
        if self.failed is not None:
            raise RuntimeError(f"the RabbitMQ cluster failed to start earlier: {self.failed}")
        if self.started:
            return
        REGISTRY.add(self)
        try:
            self._start()
        except BaseException as err:
            self.failed = f"{type(err).__name__}: {err}"
            self.stop()
            raise
        self.started = True

    def _start(self) -> None:
        self.epmd.start()
        wait_until(lambda: port_open(self.epmd_port), 10.0, "epmd", watch=[self.epmd])
        for proc in self.procs:
            proc.start()
        for port, proc in zip(self.amqp_ports, self.procs, strict=True):
            wait_until(functools.partial(port_open, port), 120.0, proc.name, watch=self.procs)
        wait_until(self._clustered, 60.0, "RabbitMQ cluster formation", interval_s=1.0, watch=self.procs)

    def _clustered(self) -> bool:
        status = json.loads(self.ctl(0, "cluster_status", "--formatter", "json"))
        return len(status.get("running_nodes", [])) == self.nodes

    def ctl(self, i: int, *args: str) -> str:
        """Run rabbitmqctl against node ``i`` (as user rabbitmq, with the cluster's cookie and epmd)."""
        out = subprocess.run([CTL, "-n", self.names[i], "-q", *args], capture_output=True, text=True,
                             env=self._base_env(), user=USER, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop(grace_s=15.0)
        self.epmd.stop()
        self.started = False
        REGISTRY.discard(self)

    def url(self, i: int) -> str:
        return f"amqp://guest:guest@{LOOPBACK}:{self.amqp_ports[i]}/"


async def _consume_until(channel: aio_pika.abc.AbstractChannel, queue: aio_pika.abc.AbstractQueue,
                         on_message: Callable[[AbstractIncomingMessage], Awaitable[None]], done: asyncio.Event, *,
                         no_ack: bool = False, arguments: dict[str, Any] | None = None,
                         ready: asyncio.Event | None = None) -> None:
    """Consume ``queue`` with ``on_message`` until ``done`` is set (``ready`` once consuming), then
    cancel the consumer and close its ``channel``, also when cancelled."""
    tag = await queue.consume(on_message, no_ack=no_ack, arguments=arguments)
    if ready is not None:
        ready.set()
    try:
        await done.wait()
    finally:
        with contextlib.suppress(Exception):
            await queue.cancel(tag)
        with contextlib.suppress(Exception):
            await channel.close()


class RabbitEndpoint(Endpoint):
    """An aio-pika connection with one confirming channel; moves to the next node when it breaks."""

    def __init__(self, cluster: RabbitCluster, queue_type: str, node: int) -> None:
        self.tuning = TUNING
        self._cluster = cluster
        self._queue_type = queue_type
        self._node = node
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._lock = asyncio.Lock()
        self._channel_opened_at = 0.0

    async def connect(self) -> None:
        self._connection = await aio_pika.connect(self._cluster.url(self._node), timeout=5)
        self._channel = await self._connection.channel(publisher_confirms=True)
        self._channel_opened_at = time.monotonic()

    def _open_channel(self) -> aio_pika.abc.AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            raise ConnectionError("no open channel")
        return self._channel

    async def create(self, stream: str) -> None:
        """Declare the queue; retried for up to ``CREATE_RETRY_S`` (a node that just rejoined may still be
        starting its stream coordinator; the failed declare closes the channel, so open a new one)."""
        deadline = time.monotonic() + CREATE_RETRY_S
        while True:
            try:
                await self._open_channel().declare_queue(stream, durable=True,
                                                         arguments={"x-queue-type": self._queue_type})
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
                self._channel_opened_at = 0.0
                await self.recover()

    async def publish(self, stream: str, payloads: Sequence[bytes]) -> None:
        exchange = self._open_channel().default_exchange
        await asyncio.gather(*(
            exchange.publish(aio_pika.Message(p, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=stream)
            for p in payloads
        ))

    async def consume(self, stream: str, count: int, on_value: Callable[[bytes], None],
                      ready: asyncio.Event | None = None) -> int:
        assert self._connection is not None
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=2000)
        queue = await channel.declare_queue(stream, durable=True, arguments={"x-queue-type": self._queue_type})
        done = asyncio.Event()
        seen = 0
        is_stream = self._queue_type == "stream"

        async def on_message(message: AbstractIncomingMessage) -> None:
            nonlocal seen
            if seen >= count:
                return
            on_value(message.body)
            seen += 1
            if is_stream and (seen % STREAM_ACK_EVERY == 0 or seen >= count):
                await message.ack(multiple=True)
            if seen >= count:
                done.set()

        args: dict[str, Any] | None = {"x-stream-offset": "first"} if is_stream else None
        await _consume_until(channel, queue, on_message, done, no_ack=not is_stream, arguments=args, ready=ready)
        return seen

    async def work(self, stream: str, count: int, concurrency: int, on_done: Callable[[bytes], None]) -> None:
        """One consumer on its own channel with ``prefetch_count=concurrency`` and manual acks, a
        ``basic.ack`` per message (AMQP does not confirm an ack: it is counted once sent)."""
        if self._queue_type != "quorum":
            raise NotAvailable(f"a {self._queue_type} has no per-message acknowledgements")
        assert self._connection is not None
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=concurrency)
        queue = await channel.declare_queue(stream, durable=True, arguments={"x-queue-type": self._queue_type})
        done = asyncio.Event()
        acked = 0

        async def on_message(message: AbstractIncomingMessage) -> None:
            nonlocal acked
            await message.ack()
            acked += 1
            on_done(message.body)
            if acked >= count:
                done.set()

        await _consume_until(channel, queue, on_message, done)

    async def recover(self) -> None:
        """After a failed publish: reconnect to the next node that accepts a connection, or, if the
        connection is fine, open a fresh channel at most every ``CHANNEL_REOPEN_S`` (a channel that
        knew the dead queue leader keeps nacking; a new one finds the new leader). Serialized."""
        async with self._lock:
            if self._connection is not None and not self._connection.is_closed:
                now = time.monotonic()
                if now - self._channel_opened_at < CHANNEL_REOPEN_S:
                    return
                self._channel_opened_at = now
                try:
                    old, self._channel = self._channel, await self._connection.channel(publisher_confirms=True)
                except Exception:  # noqa: BLE001 (the connection is dead too: move to another node)
                    pass
                else:
                    if old is not None:
                        with contextlib.suppress(Exception):
                            await old.close()
                    return
            for _ in range(self._cluster.nodes):
                self._node = (self._node + 1) % self._cluster.nodes
                try:
                    await self.connect()
                    return
                except Exception:  # noqa: BLE001 (that node is down: try the next)
                    continue

    async def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()


class RabbitDeployment(Deployment):
    """One queue type (``quorum`` or ``stream``) on a shared :class:`RabbitCluster`."""

    def __init__(self, cluster: RabbitCluster, queue_type: str, *, owns_cluster: bool) -> None:
        assert queue_type in ("quorum", "stream")
        self.cluster = cluster
        self.queue_type = queue_type
        self.owns_cluster = owns_cluster
        self.workdir = cluster.workdir
        self.info = DeploymentInfo(
            system="rabbitmq", variant=f"{queue_type} {'queue' if queue_type == 'quorum' else ''}".strip(),
            nodes=cluster.nodes, version=_version(),
            guarantee="confirm after a majority of the queue's replicas fsynced the message",
            client="aio-pika, publisher confirms, 1000 publishes gathered, 2 batches in flight" + (
                "; work queue: one consumer, prefetch = the concurrency, a basic.ack per message"
                if queue_type == "quorum" else ""),
            publish_api="one AMQP basic.publish per record, 1000 confirms awaited together, 2 batches in flight",
            notes=["streams read over AMQP (no rstream client); consume acks every 500"]
            if queue_type == "stream" else [],
        )

    def start(self) -> None:
        self.cluster.start()

    def work_queue_unsupported(self) -> str | None:
        return None if self.queue_type == "quorum" else "a stream has no per-message acks (readers keep an offset)"

    def stop(self) -> None:
        if self.owns_cluster:
            self.cluster.stop()

    def server_pgids(self) -> list[int]:
        procs = [self.cluster.epmd, *self.cluster.procs]
        return [p.pid for p in procs if p.pid is not None and p.alive()]

    async def endpoint(self) -> Endpoint:
        node = next((i for i, p in enumerate(self.cluster.procs) if p.alive()), 0)
        endpoint = RabbitEndpoint(self.cluster, self.queue_type, node)
        await endpoint.connect()
        return endpoint

    async def leader_node(self, stream: str) -> int:
        out = await asyncio.to_thread(self.cluster.ctl, self._alive_node(), "list_queues", "name", "leader",
                                      "--formatter", "json")
        for row in json.loads(out):
            if row.get("name") == stream and row.get("leader") in self.cluster.names:
                return self.cluster.names.index(row["leader"])
        raise RuntimeError(f"no leader known for queue {stream}: {out.strip()}")

    def _alive_node(self) -> int:
        return next(i for i, p in enumerate(self.cluster.procs) if p.alive())

    def kill_node(self, i: int) -> None:
        self.cluster.procs[i].kill9()

    def spawn_node(self, i: int) -> None:
        self.cluster.procs[i].start()

    async def node_holds(self, i: int, stream: str, records: int) -> bool:
        """Node ``i`` accepts AMQP and, asked through it, the queue reports ``records`` messages."""
        if not port_open(self.cluster.amqp_ports[i]):
            return False
        try:
            connection = await aio_pika.connect(self.cluster.url(i), timeout=2)
        except Exception:  # noqa: BLE001 (still booting)
            return False
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(stream, passive=True)
            held = queue.declaration_result.message_count or 0
            return self.queue_type == "stream" or held >= records
        except Exception:  # noqa: BLE001 (the queue's member on that node is not ready yet)
            return False
        finally:
            with contextlib.suppress(Exception):
                await connection.close()
