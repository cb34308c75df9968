"""Concurrent ``publish`` calls (asyncio tasks, and threads on the sync client) against a real
3-node cluster: they share requests (counted by the nodes' own gRPC metrics), every record is
stored once, and a bad record among good ones fails only its own caller
(:mod:`broker.client.coalescing`)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.client import Client, DuplicateMessageError, InvalidArgument, Record
from broker.client.aio import AsyncClient
from broker.client.models import PublishResult
from broker.devcluster import DevCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def publish_calls(cluster: DevCluster, method: str = "Publish",
                  family_name: str = "raftbroker_grpc_server_started") -> float:
    """``method`` RPCs started on every node so far (a redirected one counts on each node it reached);
    another ``family_name`` of the per-RPC metrics counts what it counts."""
    total = 0.0
    for i in range(cluster.nodes):
        text = urllib.request.urlopen(f"http://{cluster.metrics_address(i)}/metrics", timeout=5).read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == family_name:
                total += sum(s.value for s in family.samples
                             if s.name.endswith("_total") and s.labels.get("grpc_method") == method)
    return total


def stream_requests(cluster: DevCluster) -> float:
    """Requests read on ``PublishStream`` calls on every node so far."""
    return publish_calls(cluster, "PublishStream", "raftbroker_grpc_server_msg_received")


async def _read_all(c: AsyncClient, topic: str) -> list[bytes]:
    return [r.value async for r in c.subscribe(topic, stop_at_end=True) if isinstance(r, Record)]


def test_concurrent_publishes_share_requests_and_each_record_is_stored_once(cluster: DevCluster) -> None:
    async def main() -> tuple[float, float]:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("co-t", 2)
            await c.publish("co-t", "warm-up")  # the client has found the leader before counting
            before = publish_calls(cluster)
            results = await asyncio.gather(*(c.publish("co-t", f"v{i}") for i in range(300)))
            coalesced = publish_calls(cluster) - before
            assert len({(r.partition, r.offset) for r in results}) == 300 and not any(r.duplicate for r in results)
            assert sorted(await _read_all(c, "co-t")) == sorted([b"warm-up"] + [f"v{i}".encode() for i in range(300)])
        async with AsyncClient(cluster.addresses, coalesce_publishes=False) as c:
            await c.publish("co-t", "warm-up")
            before = publish_calls(cluster)
            await asyncio.gather(*(c.publish("co-t", f"w{i}") for i in range(30)))
            separate = publish_calls(cluster) - before
        return coalesced, separate

    coalesced, separate = asyncio.run(main())
    assert coalesced <= 10, f"300 concurrent publishes took {coalesced:.0f} requests"
    assert separate >= 30, "with coalescing off each publish is its own request"


def test_coalesced_requests_travel_on_one_stream_per_topic(cluster: DevCluster) -> None:
    """``PublishStream`` carries the coalesced requests (:mod:`broker.client.aio.publish_streams`):
    once a topic's stream is open, concurrent publishes start no call at all."""

    async def main() -> tuple[float, float, float, float]:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("co-st1", 2)
            await c.create_topic("co-st2")
            await c.publish("co-st1", "warm-up")
            await c.publish("co-st2", "warm-up")
            unary, streams = publish_calls(cluster), publish_calls(cluster, "PublishStream")
            results = await asyncio.gather(*(c.publish(f"co-st{1 + i % 2}", f"v{i}") for i in range(300)))
            unary, streams = publish_calls(cluster) - unary, publish_calls(cluster, "PublishStream") - streams
            places = {(i % 2, r.partition, r.offset) for i, r in enumerate(results)}
            assert len(places) == 300 and not any(r.duplicate for r in results)
            stored = await _read_all(c, "co-st1") + await _read_all(c, "co-st2")
            assert sorted(stored) == sorted([b"warm-up"] * 2 + [f"v{i}".encode() for i in range(300)])
        async with AsyncClient(cluster.addresses, stream_publishes=False) as c:
            await c.publish("co-st1", "warm-up")
            off_unary, off_streams = publish_calls(cluster), publish_calls(cluster, "PublishStream")
            await asyncio.gather(*(c.publish("co-st1", f"w{i}") for i in range(30)))
            off_unary = publish_calls(cluster) - off_unary
            off_streams = publish_calls(cluster, "PublishStream") - off_streams
        return unary, streams, off_unary, off_streams

    unary, streams, off_unary, off_streams = asyncio.run(main())
    assert (unary, streams) == (0, 0), f"{unary:.0f} Publish and {streams:.0f} PublishStream calls started"
    assert off_unary >= 1 and off_streams == 0, "stream_publishes=False: unary calls"


def test_a_node_that_refuses_more_streams_is_published_to_with_unary_calls(tmp_path: Path) -> None:
    """A node at its ``max_streams`` refuses the publish stream (RESOURCE_EXHAUSTED); the request goes
    again as a unary call and the caller never sees the refusal."""
    env = dict(os.environ, RAFTBROKER_MAX_STREAMS="1")
    node = DevCluster(1, tmp_path / "c", env=env).start()
    try:
        node.wait_ready(60)

        async def main() -> list[PublishResult]:
            async with AsyncClient(node.addresses) as c:
                await c.create_topic("co-full")
                await c.publish_batch("co-full", ["first"])  # a unary call
            async with AsyncClient(node.addresses) as holder, AsyncClient(node.addresses) as c:
                sub = holder.subscribe("co-full")  # holds the node's one stream slot
                first = await sub.__anext__()
                assert isinstance(first, Record) and first.value == b"first"
                results = await asyncio.gather(*(c.publish("co-full", f"v{i}") for i in range(20)))
                results.append(await c.publish("co-full", "after"))
                await sub.close()
                return results

        before = publish_calls(node)
        results = asyncio.run(main())
        assert len({r.offset for r in results}) == 21 and not any(r.duplicate for r in results)
        assert publish_calls(node) - before >= 2, "the refused stream's requests went as unary calls"
        with Client(node.addresses) as c:
            stored = [r.value for r in c.subscribe("co-full", stop_at_end=True) if isinstance(r, Record)]
        assert sorted(stored) == sorted([b"first", b"after"] + [f"v{i}".encode() for i in range(20)])
    finally:
        node.stop()


def test_a_publish_stream_broken_by_a_killed_node_is_retried_and_stores_once(tmp_path: Path) -> None:
    """kill -9 of the node under an open publish stream: the next request's write fails (grpc says
    INTERNAL "Internal error from Core"), which is UNAVAILABLE to the router: it retries until the node
    is back, and the record is stored once."""
    node = DevCluster(1, tmp_path / "c").start()
    try:
        node.wait_ready(60)

        async def main() -> PublishResult:
            async with AsyncClient(node.addresses, retry_deadline_s=60) as c:
                await c.create_topic("co-kill")
                await c.publish("co-kill", "before")  # the topic's stream is open
                node.kill(0)
                after = asyncio.create_task(c.publish("co-kill", "after"))
                await asyncio.sleep(0.2)
                node.spawn(0)
                return await after

        result = asyncio.run(main())
        assert not result.duplicate
        with Client(node.addresses, retry_deadline_s=60) as c:
            stored = [r.value for r in c.subscribe("co-kill", stop_at_end=True) if isinstance(r, Record)]
        assert stored == [b"before", b"after"]
    finally:
        node.stop()


def test_a_bad_record_among_concurrent_publishes_fails_only_its_own_caller(cluster: DevCluster) -> None:
    schema = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}

    def value(i: int) -> str:
        if i == 7:
            return json.dumps({"no_url": True})  # refused by the topic's schema
        return json.dumps({"url": "u3" if i == 11 else f"u{i}"})  # 11 repeats 3's dedup field

    async def main() -> list[PublishResult | BaseException]:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("co-s", schema=schema, dedup_fields=["url"])
            outcomes = await asyncio.gather(*(c.publish("co-s", value(i)) for i in range(20)), return_exceptions=True)
            stored = await _read_all(c, "co-s")
        assert sorted(stored) == sorted(value(i).encode() for i in range(20) if i not in (7, 11))
        return outcomes

    outcomes = asyncio.run(main())
    assert isinstance(outcomes[7], InvalidArgument), outcomes[7]
    assert isinstance(outcomes[11], DuplicateMessageError), outcomes[11]
    good = [o for i, o in enumerate(outcomes) if i not in (7, 11)]
    assert all(isinstance(o, PublishResult) and not o.duplicate for o in good)


def test_threads_publishing_on_one_sync_client_share_requests(cluster: DevCluster) -> None:
    """Counted as unary calls (``stream_publishes=False``): on streams no call starts at all."""
    threads, each = 20, 20
    with Client(cluster.addresses, stream_publishes=False) as c:
        c.create_topic("co-sync", 2)
        c.publish("co-sync", "warm-up")
        before = publish_calls(cluster)
        results: list[PublishResult] = []
        start = threading.Barrier(threads)

        def publisher(n: int) -> None:
            start.wait()
            for i in range(each):  # one after another, as a request handler publishing its events
                results.append(c.publish("co-sync", f"t{n}-{i}"))

        workers = [threading.Thread(target=publisher, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        calls = publish_calls(cluster) - before
        assert len(results) == threads * each
        assert len({(r.partition, r.offset) for r in results}) == threads * each
        stored = [r.value for r in c.subscribe("co-sync", stop_at_end=True) if isinstance(r, Record)]
    assert sorted(stored) == sorted([b"warm-up"] + [f"t{n}-{i}".encode() for n in range(threads) for i in range(each)])
    assert calls <= threads * each / 2, f"{threads * each} publishes from {threads} threads took {calls:.0f} requests"


def test_sync_coalesced_requests_travel_on_one_stream_per_topic(cluster: DevCluster) -> None:
    """The sync client's twin (:mod:`broker.client.publish_streams`): once a topic's stream is open,
    publishes from many threads start no call at all, and each record is stored once."""
    threads, each = 8, 25
    with Client(cluster.addresses) as c:
        c.create_topic("co-sst1", 2)
        c.create_topic("co-sst2")
        c.publish("co-sst1", "warm-up")
        c.publish("co-sst2", "warm-up")
        unary, streams = publish_calls(cluster), publish_calls(cluster, "PublishStream")
        requests = stream_requests(cluster)
        results: list[tuple[int, PublishResult]] = []

        def publisher(n: int) -> None:
            for i in range(each):
                topic = 1 + (n + i) % 2
                results.append((topic, c.publish(f"co-sst{topic}", f"t{n}-{i}")))

        workers = [threading.Thread(target=publisher, args=(n,)) for n in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        unary, streams = publish_calls(cluster) - unary, publish_calls(cluster, "PublishStream") - streams
        requests = stream_requests(cluster) - requests
        assert 1 <= requests <= threads * each, f"{threads * each} publishes read as {requests:.0f} stream requests"
        assert len({(t, r.partition, r.offset) for t, r in results}) == threads * each
        assert not any(r.duplicate for _, r in results)
        stored = [r.value for t in (1, 2) for r in c.subscribe(f"co-sst{t}", stop_at_end=True) if isinstance(r, Record)]
    sent = [f"t{n}-{i}".encode() for n in range(threads) for i in range(each)]
    assert sorted(stored) == sorted([b"warm-up"] * 2 + sent)
    assert (unary, streams) == (0, 0), f"{unary:.0f} Publish and {streams:.0f} PublishStream calls started"


def test_a_node_that_refuses_more_streams_gets_the_sync_clients_publishes_as_unary_calls(tmp_path: Path) -> None:
    env = dict(os.environ, RAFTBROKER_MAX_STREAMS="1")
    node = DevCluster(1, tmp_path / "c", env=env).start()
    try:
        node.wait_ready(60)
        with Client(node.addresses) as c:
            c.create_topic("co-sfull")
            c.publish_batch("co-sfull", ["first"])  # a unary call
        with Client(node.addresses) as holder, Client(node.addresses) as c:
            sub = iter(holder.subscribe("co-sfull"))  # holds the node's one stream slot
            first = next(sub)
            assert isinstance(first, Record) and first.value == b"first"
            before = publish_calls(node)
            results = [c.publish("co-sfull", f"v{i}") for i in range(5)]
            assert publish_calls(node) - before == 5, "the refused stream's request and the next ones went unary"
        assert len({r.offset for r in results}) == 5 and not any(r.duplicate for r in results)
        with Client(node.addresses) as c:
            stored = [r.value for r in c.subscribe("co-sfull", stop_at_end=True) if isinstance(r, Record)]
        assert stored == [b"first"] + [f"v{i}".encode() for i in range(5)]
    finally:
        node.stop()


def test_a_sync_publish_stream_broken_by_a_killed_node_is_retried_and_stores_once(tmp_path: Path) -> None:
    """kill -9 of the node under the sync client's open publish stream: the next request finds the
    stream ended with its connection and opens another, which cannot connect (UNAVAILABLE, not sent)
    until the node is back; the router retries meanwhile and the record is stored once."""
    node = DevCluster(1, tmp_path / "c").start()
    try:
        node.wait_ready(60)
        with Client(node.addresses, retry_deadline_s=60) as c:
            c.create_topic("co-skill")
            c.publish("co-skill", "before")  # the topic's stream is open
            node.kill(0)
            outcome: list[PublishResult | BaseException] = []

            def after() -> None:
                try:
                    outcome.append(c.publish("co-skill", "after"))
                except BaseException as err:  # noqa: BLE001 - reported by the assertion below
                    outcome.append(err)

            thread = threading.Thread(target=after)
            thread.start()
            node.spawn(0)
            thread.join(90)
            assert len(outcome) == 1 and isinstance(outcome[0], PublishResult), outcome
            assert not outcome[0].duplicate
            stored = [r.value for r in c.subscribe("co-skill", stop_at_end=True) if isinstance(r, Record)]
        assert stored == [b"before", b"after"]
    finally:
        node.stop()
