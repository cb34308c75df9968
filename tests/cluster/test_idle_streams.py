"""Idle streams cannot starve a node (issue 11 item 5): 1,000 idle subscribers on one node while
another client publishes and calls NodeStatus and Health there; the stream cap answers
RESOURCE_EXHAUSTED past ``max_streams``."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.client import Client
from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, common_pb2
from tests.cluster.stubs import stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

SUBSCRIBERS = 1000
CHANNELS = 10
STREAMS_MAX = SUBSCRIBERS + 10
UNARY_TIMEOUT_S = 15.0  # generous: the machine is shared; a starved node never answers at all


class IdleSubscribers:
    """``count`` Subscribe streams from LATEST on one node, driven by one asyncio loop in a thread;
    each stream records the first batch it receives and then stays open."""

    def __init__(self, address: str, topic: str, count: int) -> None:
        self.address, self.topic, self.count = address, topic, count
        self.first: dict[int, bytes] = {}
        self.errors: list[grpc.StatusCode] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._channels: list[grpc.aio.Channel] = []
        self._calls: list[object] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(60)

    async def _open(self) -> None:
        self._channels = [grpc.aio.insecure_channel(self.address) for _ in range(CHANNELS)]
        request = broker_pb2.SubscribeRequest(topic=self.topic, **{"from": common_pb2.Position(
            start=common_pb2.START_POSITION_LATEST)})
        for i in range(self.count):
            stub = broker_pb2_grpc.BrokerStub(self._channels[i % CHANNELS])
            self._tasks.append(asyncio.get_running_loop().create_task(self._read(i, stub, request)))

    async def _read(self, i: int, stub: broker_pb2_grpc.BrokerStub, request: broker_pb2.SubscribeRequest) -> None:
        call = stub.Subscribe(request)
        try:
            async for response in call:
                if response.HasField("batch") and i not in self.first:
                    self.first[i] = response.batch.records[0].value
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.errors.append(exc.code())

    def close(self) -> None:
        async def shut() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for channel in self._channels:
                await channel.close()
            # gRPC's own tasks (each call's status handler, holding the call and its channel) end
            # only after the close; a loop stopped before they do keeps every channel alive for good
            others = asyncio.all_tasks() - {asyncio.current_task()}
            await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), 30)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(60)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
        self._channels, self._calls, self._tasks = [], [], []  # the closed channels can be freed


def follower_knows(address: str, topic: str) -> bool:
    s = stubs(address)
    try:
        list(s.broker.Subscribe(broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True), timeout=5))
        return True
    except grpc.RpcError:
        return False
    finally:
        s.close()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_subscribers(cluster: DevCluster, node: int) -> float:
    """The node's ``raftbroker_subscribers`` gauge (open subscription streams)."""
    url = f"http://{cluster.metrics_address(node)}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("raftbroker_subscribers "):
                return float(line.split()[1])
    raise AssertionError("no raftbroker_subscribers gauge")


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    env = dict(os.environ, RAFTBROKER_MAX_STREAMS=str(STREAMS_MAX))
    c = DevCluster(3, tmp_path_factory.mktemp("idle"), env=env).start()
    try:
        c.wait_ready(60)
        yield c
    finally:
        c.stop()


def test_a_thousand_idle_subscribers_do_not_starve_unary_calls_or_health(capped: DevCluster) -> None:
    leader_address = capped.wait_ready(60)
    node = capped.addresses.index(leader_address)
    s = stubs(leader_address)
    client = Client(capped.addresses, retry_deadline_s=60)
    subs = IdleSubscribers(leader_address, "idle", SUBSCRIBERS)
    try:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="idle")), timeout=30)
        subs.start()
        wait_until(lambda: open_subscribers(capped, node) == SUBSCRIBERS or subs.errors, 180,
                   f"{SUBSCRIBERS} open subscription streams")
        assert not subs.errors, subs.errors[:5]
        proc = capped.procs[node]
        assert proc is not None
        before, started = cpu_s(proc.pid), time.monotonic()
        time.sleep(5)  # a measurement window, not a wait for state
        busy = 100 * (cpu_s(proc.pid) - before) / (time.monotonic() - started)
        print(f"node CPU with {SUBSCRIBERS} idle streams: {busy:.1f} %")
        health = health_pb2_grpc.HealthStub(s.channel)
        admin = admin_pb2_grpc.AdminStub(s.channel)
        worst_s = 0.0
        for i in range(20):
            started = time.monotonic()
            request = broker_pb2.PublishRequest(topic="idle", records=[broker_pb2.PublishRecord(value=b"m%d" % i)])
            try:
                s.broker.Publish(request, timeout=UNARY_TIMEOUT_S)
            except grpc.RpcError as exc:  # leadership moved (a busy machine): an answer all the same
                assert exc.code() in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.FAILED_PRECONDITION), exc
                client.publish("idle", b"m%d" % i)
            info = admin.NodeStatus(admin_pb2.NodeStatusRequest(), timeout=UNARY_TIMEOUT_S)
            assert info.role in ("leader", "follower", "candidate")
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=UNARY_TIMEOUT_S)
            assert reply.status in (health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING)
            worst_s = max(worst_s, time.monotonic() - started)
        print(f"slowest Publish+NodeStatus+Health round with {SUBSCRIBERS} idle streams: {worst_s:.3f} s")
        # every idle stream was woken by the change signal and got the first record
        wait_until(lambda: len(subs.first) == SUBSCRIBERS, 120, "every subscriber to receive a record")
        assert set(subs.first.values()) <= {b"m%d" % i for i in range(20)}
        assert not subs.errors, subs.errors[:5]
        # the cap: ten more streams fit, the next one is refused with a clear status
        extra = [s.broker.Subscribe(broker_pb2.SubscribeRequest(topic="idle"))
                 for _ in range(STREAMS_MAX - SUBSCRIBERS)]
        wait_until(lambda: open_subscribers(capped, node) == STREAMS_MAX, 60, "the extra streams to open")
        with pytest.raises(grpc.RpcError) as info:
            next(iter(s.broker.Subscribe(broker_pb2.SubscribeRequest(topic="idle"), timeout=UNARY_TIMEOUT_S)))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"at most {STREAMS_MAX} streams" in info.value.details()
        for call in extra:
            call.cancel()
        # closed streams give their places back
        wait_until(lambda: open_subscribers(capped, node) == SUBSCRIBERS, 60, "the extra streams to close")
        client.publish("idle", b"x")
    finally:
        subs.close()
        client.close()
        s.close()


def test_a_node_stopping_gracefully_ends_its_open_streams_and_exits(capped: DevCluster) -> None:
    """SIGTERM with 200 idle streams open: every stream ends with a status (none hangs) and the
    node exits cleanly within its grace period plus a margin."""
    leader = capped.addresses.index(capped.wait_ready(60))
    node = (leader + 1) % capped.nodes  # a follower: no leadership hand-over in the way
    subs = IdleSubscribers(capped.grpc_address(node), "idle-stop", 200)
    try:
        with Client(capped.addresses, retry_deadline_s=60) as client:
            client.create_topic("idle-stop")
        wait_until(lambda: follower_knows(capped.grpc_address(node), "idle-stop"), 30, "the follower to have the topic")
        subs.start()
        wait_until(lambda: open_subscribers(capped, node) == 200 or subs.errors, 120, "200 open streams")
        assert not subs.errors, subs.errors[:5]
        proc = capped.procs[node]
        assert proc is not None
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        print(f"node stopped with 200 open streams in {time.monotonic() - started:.2f} s")
        wait_until(lambda: len(subs.errors) == 200, 30, "every stream to end with a status")
        assert set(subs.errors) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}, set(subs.errors)
    finally:
        subs.close()
        if not capped.alive(node):
            capped.spawn(node)
        capped.wait_ready(60)
