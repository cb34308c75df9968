"""The workloads, written once against :class:`~bench.systems.base.Deployment` / ``Endpoint``.

Each function runs one repetition and returns plain numbers (seconds, msgs/s, milliseconds) keyed by
metric name. Every repetition uses a fresh stream, so no run reads another's records. Every record
carries its own random payload (:class:`Payloads`, seeded), so no system gains from compressing
repeated values.

- :func:`publish_consume`: closed loop, ``count`` records published with the system's batch size and
  batches in flight, counted when acknowledged (stopping at ``cap_s``); then a fresh client reads them
  all back. The CPU seconds of the servers and of the client during the publish give msgs per CPU-second.
- :func:`latency`: open loop at a fixed offered rate. Arrivals are scheduled on a clock and the
  latency of a record runs from its *scheduled* send time (no coordinated omission); records that
  arrive while earlier ones are in flight are coalesced into the next request (as a linger-style
  client does). A live subscriber, started before the first publish, measures publish→delivery.
- :func:`work_queue`: ``count`` records are stored first (not measured), then a fresh client drains the
  stream as a work queue: competing consumers with ``concurrency`` records in flight, each acknowledged
  on its own, counted when the system confirms the acknowledgement (stopping at ``cap_s``).
- :func:`failover`: a steady publish (one record every ``interval_s``) while the node holding the
  stream's leader is killed with SIGKILL; the figure is the time from the kill to the first
  acknowledgement of a publish that was started after the kill.
- :func:`recovery`: fill a stream with ``records`` records, kill -9 a node holding them (a follower
  when there is one) and measure from its restart until it serves and holds them all again.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hdrh.histogram import HdrHistogram

from bench.cpu import CpuSample
from bench.systems.base import Deployment, Endpoint

Metrics = dict[str, float]
_STAMP = struct.Struct("<q")  # perf_counter_ns of the scheduled send, at the start of every payload
HIST_MAX_US = 120_000_000
POLL_S = 0.05
E2E_DRAIN_S = 10.0  # how long the latency run waits for deliveries after the last publish


def stream_name(kind: str) -> str:
    """A fresh stream name (letters, digits and dashes only: valid on every system)."""
    return f"bench-{kind}-{uuid.uuid4().hex[:8]}"


POOL_BITS = 25  # the payload pool is 32 MiB (+ one payload) of seeded random bytes


class Payloads:
    """Distinct random payloads of ``size_bytes`` (at least 8: room for the latency workload's timestamp).

    Record ``k`` is the window of a seeded random pool at offset ``k * stride mod 2**POOL_BITS`` with an
    odd ``stride >= size_bytes``: offsets are distinct for the first 2**25 records (so are the
    payloads, being random) and the records of one batch never overlap, so a batch does not compress.
    The pool is built before any measured window; taking a batch is one slice per record.
    """

    def __init__(self, size_bytes: int, seed: int) -> None:
        self.size = max(size_bytes, _STAMP.size)
        self._stride = self.size | 1
        self._pool = random.Random(seed).randbytes((1 << POOL_BITS) + self.size)
        self._mask = (1 << POOL_BITS) - 1

    def get(self, k: int) -> bytes:
        off = (k * self._stride) & self._mask
        return self._pool[off:off + self.size]

    def batch(self, first: int, count: int) -> list[bytes]:
        return [self.get(k) for k in range(first, first + count)]


async def _closed_loop_publish(ep: Endpoint, stream: str, payloads: Payloads, count: int, deadline: float) -> int:
    """Publish ``count`` distinct payloads (stop starting batches at ``deadline``); return acked records."""
    batch = ep.tuning.batch_records
    batches = [batch] * (count // batch) + ([count % batch] if count % batch else [])
    acked = 0
    next_index = 0

    async def worker() -> None:
        nonlocal acked, next_index
        while next_index < len(batches) and time.perf_counter() < deadline:
            size = batches[next_index]
            first = next_index * batch + 1  # record 0 is the warm-up publish
            next_index += 1
            await ep.publish(stream, payloads.batch(first, size))
            acked += size

    await asyncio.gather(*(worker() for _ in range(ep.tuning.inflight_batches)))
    return acked


async def publish_consume(deployment: Deployment, size_bytes: int, count: int, cap_s: float,
                          seed: int = 0) -> Metrics:
    """One repetition of acknowledged publish throughput followed by consume throughput of the same records;
    also the CPU seconds the servers and the client spent during the publish."""
    stream = stream_name(f"pub{size_bytes}")
    payloads = Payloads(size_bytes, seed)
    ep = await deployment.endpoint()
    try:
        await ep.create(stream)
        await ep.publish(stream, payloads.batch(0, 1))  # warm-up: connections, leader discovery, stream placement
        pgids = deployment.server_pgids()
        cpu_before = CpuSample.take(pgids)
        started = time.perf_counter()
        acked = await _closed_loop_publish(ep, stream, payloads, count, started + cap_s)
        publish_s = time.perf_counter() - started
        cpu = CpuSample.take(pgids).since(cpu_before)
    finally:
        await ep.close()
    total = acked + 1
    read = 0

    def on_value(value: bytes) -> None:
        nonlocal read
        read += 1

    reader = await deployment.endpoint()
    try:
        started = time.perf_counter()
        # A slow reader stops at the cap too; the rate counts what it read by then.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader.consume(stream, total, on_value), timeout=cap_s)
        consume_s = time.perf_counter() - started
    finally:
        await reader.close()
    metrics = {"publish_msgs_per_s": acked / publish_s, "published": float(acked),
               "consume_msgs_per_s": read / consume_s, "consumed": float(read), "publish_client_cpu_s": cpu.client_s}
    if pgids and cpu.servers_s > 0:  # servers this run started (an attached cluster's CPU is not visible here)
        metrics.update(publish_server_cpu_s=cpu.servers_s, publish_msgs_per_server_cpu_s=acked / cpu.servers_s,
                       publish_msgs_per_cpu_s=acked / (cpu.servers_s + cpu.client_s))
    return metrics


QUEUE_FILL_CAP_S = 60.0  # storing the work queue's records is not measured; a slow publisher stores fewer


async def work_queue(deployment: Deployment, size_bytes: int, count: int, concurrency: int, cap_s: float,
                     seed: int = 0) -> Metrics:
    """One repetition: store ``count`` records, then drain them as a work queue (per-record
    acknowledgements, ``concurrency`` in flight) for at most ``cap_s``; msgs/s and msgs per CPU-second
    of the drain, and how many acknowledged records were ones acknowledged before (redeliveries)."""
    stream, stored = await fill(deployment, count, QUEUE_FILL_CAP_S, seed, size_bytes=size_bytes,
                                kind=f"queue{size_bytes}")
    acked: set[bytes] = set()
    again = 0

    def on_done(value: bytes) -> None:
        nonlocal again
        if value in acked:
            again += 1
        acked.add(value)

    worker = await deployment.endpoint()
    try:
        pgids = deployment.server_pgids()
        cpu_before = CpuSample.take(pgids)
        started = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(worker.work(stream, stored, concurrency, on_done), timeout=cap_s)
        drain_s = time.perf_counter() - started
        cpu = CpuSample.take(pgids).since(cpu_before)
    finally:
        await worker.close()
    done = len(acked) + again
    metrics = {"queue_msgs_per_s": done / drain_s, "queue_acked": float(done), "queue_stored": float(stored),
               "queue_redelivered": float(again), "queue_client_cpu_s": cpu.client_s}
    if pgids and cpu.servers_s > 0:
        metrics.update(queue_server_cpu_s=cpu.servers_s, queue_msgs_per_cpu_s=done / (cpu.servers_s + cpu.client_s))
    return metrics


@dataclass
class _Latencies:
    ack: HdrHistogram
    e2e: HdrHistogram

    @classmethod
    def new(cls) -> _Latencies:
        return cls(HdrHistogram(1, HIST_MAX_US, 3), HdrHistogram(1, HIST_MAX_US, 3))


def _percentiles(hist: HdrHistogram, prefix: str) -> Metrics:
    if hist.get_total_count() == 0:
        return {}
    return {f"{prefix}_p50_ms": hist.get_value_at_percentile(50) / 1000,
            f"{prefix}_p99_ms": hist.get_value_at_percentile(99) / 1000,
            f"{prefix}_p999_ms": hist.get_value_at_percentile(99.9) / 1000,
            f"{prefix}_max_ms": hist.get_max_value() / 1000}


async def latency(deployment: Deployment, size_bytes: int, rate_per_s: float, duration_s: float,
                  warmup_s: float, seed: int = 0) -> Metrics:
    """One repetition: publish→ack and publish→delivery latency at ``rate_per_s`` offered for ``duration_s``
    (after ``warmup_s`` of unrecorded traffic)."""
    stream = stream_name("lat")
    payloads = Payloads(size_bytes, seed)
    hist = _Latencies.new()
    total = int(rate_per_s * (warmup_s + duration_s))
    publisher = await deployment.endpoint()
    subscriber = await deployment.endpoint()
    try:
        await publisher.create(stream)
        started_ns = time.perf_counter_ns()
        record_from_ns = started_ns + int(warmup_s * 1e9)

        def on_delivery(value: bytes) -> None:
            sent_ns = _STAMP.unpack_from(value)[0]
            if sent_ns >= record_from_ns:
                hist.e2e.record_value(max(1, (time.perf_counter_ns() - sent_ns) // 1000))

        ready = asyncio.Event()
        reader = asyncio.create_task(subscriber.consume(stream, total, on_delivery, ready))
        await asyncio.wait_for(ready.wait(), 30.0)
        await _open_loop(publisher, stream, payloads, rate_per_s, total, record_from_ns, hist.ack)
        # What was delivered is recorded; a missing tail shows as fewer e2e samples.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader, timeout=E2E_DRAIN_S)
    finally:
        await publisher.close()
        await subscriber.close()
    return {**_percentiles(hist.ack, "ack"), **_percentiles(hist.e2e, "e2e"),
            "ack_samples": float(hist.ack.get_total_count()), "e2e_samples": float(hist.e2e.get_total_count())}


async def _open_loop(ep: Endpoint, stream: str, payloads: Payloads, rate_per_s: float, total: int,
                     record_from_ns: int, ack: HdrHistogram) -> None:
    """Offer ``total`` records at ``rate_per_s`` on a schedule. Each record is its scheduled send time
    followed by the rest of its own random payload. A client that coalesces concurrent calls itself
    (``ep.publishes_one_by_one``) gets one ``publish_one`` call per record at its time, as a service
    publishing one event per request it serves; for the others what waits is coalesced here into the
    next of ``ep.tuning.inflight_batches`` requests."""
    pending: list[int] = []  # scheduled send times of records not yet handed to a sender
    wake = asyncio.Event()
    finished = False
    start_ns = time.perf_counter_ns()
    interval_ns = int(1e9 / rate_per_s)

    def value(s: int) -> bytes:
        return _STAMP.pack(s) + payloads.get((s - start_ns) // interval_ns)[_STAMP.size:]

    def acked(stamps: list[int]) -> None:
        now = time.perf_counter_ns()
        for s in stamps:
            if s >= record_from_ns:
                ack.record_value(max(1, (now - s) // 1000))

    async def sender() -> None:
        while True:
            while not pending:
                if finished:
                    return
                wake.clear()
                await wake.wait()
            stamps = pending[:ep.tuning.batch_records]
            del pending[:len(stamps)]
            await ep.publish(stream, [value(s) for s in stamps])
            acked(stamps)

    async def one(s: int) -> None:
        await ep.publish_one(stream, value(s))
        acked([s])

    one_by_one = ep.publishes_one_by_one
    senders = [] if one_by_one else [asyncio.create_task(sender()) for _ in range(ep.tuning.inflight_batches)]
    calls: set[asyncio.Task[None]] = set()
    issued = 0
    while issued < total:
        due = min(total, (time.perf_counter_ns() - start_ns) // interval_ns + 1)
        if due > issued:
            stamps = [start_ns + k * interval_ns for k in range(issued, due)]
            issued = due
            if one_by_one:
                for s in stamps:
                    task = asyncio.create_task(one(s))
                    calls.add(task)
                    task.add_done_callback(calls.discard)
            else:
                pending.extend(stamps)
                wake.set()
        await asyncio.sleep(0.0005)
    finished = True
    wake.set()
    await asyncio.gather(*senders, *calls)


async def _wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float) -> float | None:
    """Seconds until ``check()`` is true, polled every ``POLL_S``; ``None`` after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        with contextlib.suppress(Exception):
            if await check():
                return time.monotonic() - started
        await asyncio.sleep(POLL_S)
    return None


async def failover(deployment: Deployment, interval_s: float, before_s: float, timeout_s: float) -> Metrics:
    """One repetition of kill -9 of the stream leader during a steady publish."""
    stream = stream_name("fail")
    payloads = Payloads(100, 0)
    ep = await deployment.endpoint()
    acked_after_kill: list[float] = []
    acked = 0
    kill_at: float | None = None

    async def one(started: float) -> None:
        nonlocal acked
        try:
            await asyncio.wait_for(ep.publish(stream, [payloads.get(int(started * 1000))]), timeout=timeout_s)
        except Exception:  # noqa: BLE001 (a publish failed during the failover: the client may need to move)
            await ep.recover()
            return
        acked += 1
        if kill_at is not None and started >= kill_at:
            acked_after_kill.append(time.monotonic())

    tasks: list[asyncio.Task[None]] = []
    try:
        await ep.create(stream)
        await ep.publish(stream, payloads.batch(0, 1))
        leader = await deployment.leader_node(stream)
        begin = time.monotonic()
        while not acked_after_kill and time.monotonic() - begin < before_s + timeout_s:
            now = time.monotonic()
            if kill_at is None and now - begin >= before_s:
                deployment.kill_node(leader)
                kill_at = time.monotonic()
            tasks.append(asyncio.create_task(one(time.monotonic())))
            await asyncio.sleep(interval_s)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await ep.close()
    assert kill_at is not None
    if not acked_after_kill:
        raise TimeoutError(f"no publish succeeded within {timeout_s:g} s of killing node {leader}")
    result = {"failover_s": min(acked_after_kill) - kill_at, "acked_before_kill": float(acked)}
    deployment.spawn_node(leader)
    back = await _wait_for(lambda: deployment.node_holds(leader, stream, 1), 120.0)
    if back is None:
        raise TimeoutError(f"node {leader} did not rejoin within 120 s after the failover")
    return result


async def fill(deployment: Deployment, records: int, cap_s: float, seed: int = 0, *, size_bytes: int = 100,
               kind: str = "recov") -> tuple[str, int]:
    """A fresh stream holding up to ``records`` distinct records of ``size_bytes`` (fewer if ``cap_s`` runs
    out); returns its name and how many it holds."""
    stream = stream_name(kind)
    payloads = Payloads(size_bytes, seed)
    ep = await deployment.endpoint()
    try:
        await ep.create(stream)
        held = await _closed_loop_publish(ep, stream, payloads, records, time.perf_counter() + cap_s)
    finally:
        await ep.close()
    return stream, held


async def recovery(deployment: Deployment, stream: str, held: int, timeout_s: float) -> Metrics:
    """One repetition: kill -9 a node holding ``held`` records of ``stream``, restart it, time until it holds them."""
    node = deployment.recovery_node(await deployment.leader_node(stream))
    deployment.kill_node(node)
    started = time.monotonic()
    deployment.spawn_node(node)
    took = await _wait_for(lambda: deployment.node_holds(node, stream, held), timeout_s)
    if took is None:
        raise TimeoutError(f"node {node} did not hold {held} records within {timeout_s:g} s of its restart")
    return {"restart_s": time.monotonic() - started, "records_held": float(held)}
