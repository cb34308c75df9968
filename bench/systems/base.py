"""What every benchmarked system provides: a :class:`Deployment` (servers) and an :class:`Endpoint` (client).

A workload only talks to these two interfaces, so raftbroker and each peer run exactly the same
workload code. "stream" is the neutral name of the thing records go to: a raftbroker topic, a
JetStream stream, a RabbitMQ queue or a Redis stream.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


async def fetch_and_ack(fetchers: Sequence[Callable[[int], Awaitable[Sequence[T]]]], count: int, fetch_max: int,
                        ack: Callable[[T], Awaitable[None]]) -> None:
    """Drain ``count`` records as a work queue, one worker per fetcher: each fetches up to ``fetch_max``
    records that no other worker has asked for yet, acks them concurrently with ``ack``, and goes on
    until ``count`` are acked. A worker stops when the rest are asked for by others (one whose fetch
    comes back short goes on), so no fetch waits at the end for records that are not there."""
    reserved = acked = 0

    async def one(item: T) -> None:
        nonlocal acked
        await ack(item)
        acked += 1

    async def worker(fetch: Callable[[int], Awaitable[Sequence[T]]]) -> None:
        nonlocal reserved
        while acked < count:
            want = min(fetch_max, count - reserved)
            if want <= 0:
                return
            reserved += want
            got = await fetch(want)
            reserved -= want - len(got)
            await asyncio.gather(*(one(item) for item in got))

    await asyncio.gather(*(worker(fetch) for fetch in fetchers))


class NotAvailable(Exception):
    """The system (or one of its workloads) cannot run here; the message says why, for the report."""


@dataclass(frozen=True)
class ClientTuning:
    """How the best Python client path of a system publishes: records per request and requests in flight."""

    batch_records: int
    inflight_batches: int


@dataclass
class DeploymentInfo:
    """What the report says about a deployment: its guarantee and any caveat."""

    system: str  # e.g. "raftbroker", "nats"
    variant: str  # e.g. "disk-3", "R3 file"
    nodes: int
    version: str
    guarantee: str
    client: str
    publish_api: str = ""  # how records travel per request (the table states it: batch APIs differ)
    exactly_once: str = ""  # "" when a retried publish may store a record twice; else how duplicates are dropped
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.system} {self.variant}"


class Endpoint(abc.ABC):
    """One client connection (or pool) to a deployment, used from one asyncio event loop."""

    tuning: ClientTuning

    @abc.abstractmethod
    async def create(self, stream: str) -> None:
        """Create ``stream`` with the deployment's replication and durability settings."""

    @abc.abstractmethod
    async def publish(self, stream: str, payloads: Sequence[bytes]) -> None:
        """Publish ``payloads``; return once every one is acknowledged under the deployment's guarantee."""

    async def publish_one(self, stream: str, payload: bytes) -> None:
        """Publish one record as an application does, one call per event; return once it is
        acknowledged. Systems whose client coalesces concurrent calls itself provide it; the latency
        workload then leaves the batching to the client (:attr:`publishes_one_by_one`)."""
        raise NotImplementedError

    @property
    def publishes_one_by_one(self) -> bool:
        """Whether this endpoint's client batches concurrent calls itself (it provides :meth:`publish_one`)."""
        return type(self).publish_one is not Endpoint.publish_one

    @abc.abstractmethod
    async def consume(self, stream: str, count: int, on_value: Callable[[bytes], None],
                      ready: asyncio.Event | None = None) -> int:
        """Read ``stream`` from its first record until ``count`` records were delivered; call ``on_value``
        on each and return how many were read. ``ready`` is set once the subscription is established."""

    @abc.abstractmethod
    async def work(self, stream: str, count: int, concurrency: int, on_done: Callable[[bytes], None]) -> None:
        """Drain ``stream`` as a work queue of competing consumers: at most ``concurrency`` records
        delivered and not yet acknowledged at a time, each acknowledged on its own once handled (the
        handler does nothing else). Call ``on_done`` with a record's value once the system confirmed its
        acknowledgement (where acknowledgements are not confirmed, once it is sent); return when
        ``count`` were acknowledged. The caller may cancel it at its time cap."""

    async def recover(self) -> None:  # noqa: B027 (optional hook, a no-op by default)
        """After a failed publish during failover: reconnect if the client does not do so itself."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release every connection."""


class Deployment(abc.ABC):
    """A running system of one or more server processes on loopback, data under ``workdir``."""

    info: DeploymentInfo
    workdir: Path

    @abc.abstractmethod
    def start(self) -> None:
        """Start every node and wait until the system accepts writes; raises ``NotAvailable`` if it cannot."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop every process it started (by PID); safe to call twice and after a failed start."""

    @abc.abstractmethod
    async def endpoint(self) -> Endpoint:
        """A connected client."""

    @property
    def nodes(self) -> int:
        return self.info.nodes

    def failover_unsupported(self) -> str | None:
        """Why the failover workload cannot run here (``None``: it can)."""
        return None if self.nodes >= 3 else "single node: nothing to fail over to"

    def work_queue_unsupported(self) -> str | None:
        """Why the work-queue workload cannot run here (``None``: it can)."""
        return None

    @abc.abstractmethod
    def server_pgids(self) -> list[int]:
        """Process group ids of every server process running now (their CPU is the system's CPU)."""

    @abc.abstractmethod
    async def leader_node(self, stream: str) -> int:
        """Index of the node that holds the leader of ``stream`` (or the only node)."""

    @abc.abstractmethod
    def kill_node(self, i: int) -> None:
        """kill -9 node ``i`` (its whole process group) and reap it."""

    @abc.abstractmethod
    def spawn_node(self, i: int) -> None:
        """Start node ``i`` again on its old data directory."""

    @abc.abstractmethod
    async def node_holds(self, i: int, stream: str, records: int) -> bool:
        """Whether node ``i`` is up, serving, and holds ``records`` records of ``stream`` locally."""

    def recovery_node(self, leader: int) -> int:
        """The node the recovery workload restarts: a follower when there is one."""
        return (leader + 1) % self.nodes
