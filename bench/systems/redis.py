"""Redis Streams (Debian's redis-server): one node, AOF with ``appendfsync always``, driven by redis-py's
asyncio client (XADD in non-transactional pipelines, XREAD in batches).

Single node: an acknowledged XADD is fsynced on that one machine, but nothing is replicated, so
there is no failover to measure and a lost disk loses everything.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from bench.procs import LOOPBACK, REGISTRY, ManagedProcess, free_port, port_open, wait_until
from bench.systems.base import ClientTuning, Deployment, DeploymentInfo, Endpoint, NotAvailable, fetch_and_ack

TUNING = ClientTuning(batch_records=500, inflight_batches=4)
READ_BATCH = 1000
WORK_GROUP = "bench-workers"
POOL_CONNECTIONS = 72  # the endpoint's pool: room for the work queue's 64 XACKs in flight and its readers
WORK_FETCH = 16  # entries per XREADGROUP of the work-queue workload
WORK_BLOCK_MS = 1000


def _version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, timeout=10).stdout
    return out.split()[2].removeprefix("v=") if len(out.split()) > 2 else out.strip()


class RedisEndpoint(Endpoint):
    """A redis-py asyncio connection pool to the single node."""

    def __init__(self, port: int) -> None:
        self.tuning = TUNING
        self._redis = aioredis.Redis.from_pool(aioredis.BlockingConnectionPool(
            host=LOOPBACK, port=port, max_connections=POOL_CONNECTIONS))

    async def create(self, stream: str) -> None:
        await self._redis.delete(stream)

    async def publish(self, stream: str, payloads: Sequence[bytes]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for p in payloads:
                pipe.xadd(stream, {"v": p})
            await pipe.execute()

    async def consume(self, stream: str, count: int, on_value: Callable[[bytes], None],
                      ready: asyncio.Event | None = None) -> int:
        last = b"0-0"
        seen = 0
        if ready is not None:
            ready.set()
        while seen < count:
            reply: Any = await self._redis.xread({stream: last}, count=READ_BATCH, block=1000)
            for _, entries in reply:
                for entry_id, fields in entries:
                    on_value(fields[b"v"])
                    last = entry_id
                    seen += 1
        return seen

    async def work(self, stream: str, count: int, concurrency: int, on_done: Callable[[bytes], None]) -> None:
        """A consumer group: ``concurrency // WORK_FETCH`` consumers, each reading up to ``WORK_FETCH``
        entries with XREADGROUP and acking each with its own XACK (answered once the AOF is fsynced)."""
        await self._redis.xgroup_create(stream, WORK_GROUP, id="0")

        async def ack(entry: tuple[bytes, bytes]) -> None:
            await self._redis.xack(stream, WORK_GROUP, entry[0])
            on_done(entry[1])

        def reader(name: str) -> Callable[[int], Awaitable[list[tuple[bytes, bytes]]]]:
            async def read(n: int) -> list[tuple[bytes, bytes]]:
                reply: Any = await self._redis.xreadgroup(WORK_GROUP, name, {stream: ">"}, count=n,
                                                          block=WORK_BLOCK_MS)
                return [(entry_id, fields[b"v"]) for _, batch in reply or [] for entry_id, fields in batch]
            return read

        readers = [reader(f"worker-{i}") for i in range(max(1, concurrency // WORK_FETCH))]
        await fetch_and_ack(readers, count, WORK_FETCH, ack)

    async def close(self) -> None:
        await self._redis.aclose()


class RedisDeployment(Deployment):
    """One redis-server with an append-only file synced on every write."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which("redis-server") is None:
            raise NotAvailable("redis-server is not installed (apt-get install redis-server)")
        self.workdir = workdir  # the caller owns (and removes) it
        self.info = DeploymentInfo(
            system="redis", variant="Streams AOF always", nodes=1, version=_version(),
            guarantee="ack after the write is fsynced to the AOF on the one node (no replication)",
            client="redis-py asyncio, XADD pipelines of 500, 4 in flight; XREAD 1000; work queue: a consumer "
                   f"group, XREADGROUP of {WORK_FETCH}, an XACK per entry",
            publish_api="pipeline of 500 XADD commands (one per record) per round trip, 4 in flight",
            notes=["single node: no replication, no failover"],
        )
        self.port = free_port()
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        argv = ["redis-server", "--bind", LOOPBACK, "--port", str(self.port), "--dir", str(data),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
                "--protected-mode", "yes", "--io-threads", "1"]
        self.proc = ManagedProcess("redis", argv, self.workdir / "redis.log")

    def start(self) -> None:
        REGISTRY.add(self)
        self.proc.start()
        wait_until(lambda: port_open(self.port), 30.0, "redis-server", watch=[self.proc])

    def stop(self) -> None:
        self.proc.stop()
        REGISTRY.discard(self)

    async def endpoint(self) -> Endpoint:
        endpoint = RedisEndpoint(self.port)
        return endpoint

    def server_pgids(self) -> list[int]:
        return [pid for pid in (self.proc.pid,) if pid is not None and self.proc.alive()]

    async def leader_node(self, stream: str) -> int:
        return 0

    def kill_node(self, i: int) -> None:
        self.proc.kill9()

    def spawn_node(self, i: int) -> None:
        self.proc.start()

    async def node_holds(self, i: int, stream: str, records: int) -> bool:
        client = aioredis.Redis(host=LOOPBACK, port=self.port, socket_connect_timeout=0.5)
        try:
            return int(await client.xlen(stream)) >= records  # LOADING until the AOF is replayed
        except (RedisError, OSError):
            return False
        finally:
            await client.aclose()
