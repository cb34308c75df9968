"""Concurrent ``publish`` calls (asyncio tasks, and threads on the sync client) against a real
3-node cluster: they share requests (counted by the nodes' own gRPC metrics), every record is
stored once, and a bad record among good ones fails only its own caller
(:mod:`broker.client.coalescing`)."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.client import Client, DuplicateMessageError, InvalidArgument, Record
from broker.client.aio import AsyncClient
from broker.client.models import PublishResult
from broker.devcluster import DevCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def publish_calls(cluster: DevCluster) -> float:
    """Publish RPCs started on every node so far (a redirected one counts on each node it reached)."""
    total = 0.0
    for i in range(cluster.nodes):
        text = urllib.request.urlopen(f"http://{cluster.metrics_address(i)}/metrics", timeout=5).read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "raftbroker_grpc_server_started":
                total += sum(s.value for s in family.samples
                             if s.name.endswith("_total") and s.labels.get("grpc_method") == "Publish")
    return total


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
    threads, each = 20, 20
    with Client(cluster.addresses) as c:
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
