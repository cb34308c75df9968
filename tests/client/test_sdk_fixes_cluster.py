"""SDK behaviour against a real 3-node cluster: closing an AsyncClient ends the iterations over it,
a refused claim leases nothing, the asyncio SDK takes the sync arguments (producer sessions,
manual acks, ``on_event(event)``), and ``create_topic(exist_ok=True)`` keeps the server's reason."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.client import BrokerError, Client, Event, InvalidArgument, ResourceExhausted, TopicExists
from broker.client.aio import AsyncClient, AsyncMessage
from broker.devcluster import DevCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


async def until(predicate: object, timeout_s: float, what: str) -> None:
    """Poll ``predicate()`` (a callable) on the event loop until it is truthy; fail after ``timeout_s``."""
    assert callable(predicate)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(0.05)


async def collect(items: AsyncIterator[object], into: list[object]) -> None:
    async for item in items:
        into.append(item)


def test_closing_the_async_client_ends_a_subscription_and_a_consumer_being_iterated(cluster: DevCluster) -> None:
    """As the sync client's close does: the iterating task raises BrokerError (CANCELLED), at once."""
    async def main() -> None:
        c = AsyncClient(cluster.addresses)
        await c.create_topic("sdk-close", 1)
        read: list[object] = []
        leased: list[object] = []
        reader = asyncio.create_task(collect(c.subscribe("sdk-close", start="earliest"), read))
        member = asyncio.create_task(collect(c.consumer("sdk-close", "closing"), leased))
        await c.publish("sdk-close", b"one")
        await until(lambda: read and leased, 30, "both streams to deliver the record")  # both streams are open
        await c.close()
        done, pending = await asyncio.wait({reader, member}, timeout=10)
        for task in pending:
            task.cancel()
        assert not pending, "an iteration outlived the client's close"
        for task in done:
            err = task.exception()
            assert isinstance(err, BrokerError) and err.code == "CANCELLED", err
            assert "the client was closed" in err.message

    asyncio.run(main())


def test_a_claim_refused_for_its_visibility_leases_nothing(cluster: DevCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("sdk-cv", 1)
            await c.publish_batch("sdk-cv", [b"a", b"b"])
            with pytest.raises(InvalidArgument, match="visibility_ms"):
                await c.claim("sdk-cv", "g", max_records=5, visibility_ms=10**14)
            claimed = await c.claim("sdk-cv", "g", max_records=5, visibility_ms=60_000)
            assert sorted(m.value for m in claimed) == [b"a", b"b"], "the refused claim held no lease"
            for m in claimed:
                await m.ack()
            assert (await c.group_lag("sdk-cv", "g")).lag == 0

    asyncio.run(main())


def test_async_publish_in_a_callers_producer_session_deduplicates_as_the_sync_one(cluster: DevCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("sdk-s6", 1)
            first = await c.publish("sdk-s6", b"a", dedup_id="s6", msg_id=1)
            again = await c.publish("sdk-s6", b"a", dedup_id="s6", msg_id=1)
            assert not first.duplicate and again.duplicate
            assert [(w.dedup_id, w.msg_id) for w in await c.get_watermarks("sdk-s6")] == [("s6", 1)]
    asyncio.run(main())
    with Client(cluster.addresses) as sync:
        assert sync.publish("sdk-s6", b"b", dedup_id="s6", msg_id=2).duplicate is False
        assert sync.describe_topic("sdk-s6").partitions[0].records == 2


def test_async_run_takes_manual_acks_batch_size_and_the_sync_on_event(cluster: DevCluster) -> None:
    async def main() -> tuple[int, list[Event]]:
        events: list[Event] = []
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("sdk-run", 2)
            await c.publish_batch("sdk-run", [f"job{i}" for i in range(10)])

            async def handler(message: AsyncMessage) -> None:
                if int(message.value[3:]) % 2 == 0:
                    await message.ack()  # the odd ones are left unsettled: run nacks them

            handled = await c.run("sdk-run", group="manual", handler=handler, ack="manual", batch_size=10,
                                  concurrency=2, limit=10, on_event=events.append)
            lag = await c.group_lag("sdk-run", "manual")
            assert lag.lag == 5, "the five even jobs were acked by their handlers, the odd ones nacked"
            return handled, events

    handled, events = asyncio.run(main())
    assert handled == 10 and events == []


def test_create_topic_exist_ok_with_another_config_keeps_the_servers_reason_in_both_sdks(
        cluster: DevCluster) -> None:
    with Client(cluster.addresses) as sync:
        sync.create_topic("sdk-exists", 1)
        with pytest.raises(TopicExists) as plain:
            sync.create_topic("sdk-exists", 1)
        with pytest.raises(TopicExists) as differing:
            sync.create_topic("sdk-exists", 2, exist_ok=True)
    assert plain.value.reason == "TOPIC_EXISTS" and plain.value.metadata == {"topic": "sdk-exists"}
    assert differing.value.reason == "TOPIC_EXISTS" and differing.value.metadata == {"topic": "sdk-exists"}
    assert "partitions is 1, not 2" in differing.value.message

    async def main() -> TopicExists:
        async with AsyncClient(cluster.addresses) as c:
            with pytest.raises(TopicExists) as caught:
                await c.create_topic("sdk-exists", 3, exist_ok=True)
            return caught.value

    err = asyncio.run(main())
    assert err.reason == "TOPIC_EXISTS" and err.metadata == {"topic": "sdk-exists"}
    assert "partitions is 1, not 3" in err.message


def test_a_request_over_the_nodes_message_limit_is_told_in_our_words_in_both_sdks(cluster: DevCluster) -> None:
    """gRPC refuses a message over the node's limit before any handler sees it, with transport text
    ("Received message larger than max") and no reason: the SDKs say what was too large, by how much
    and what to do, with a reason, as a definite refusal."""
    schema = '{"description": "' + "x" * (12 << 20) + '"}'  # over max_batch_bytes + 1 MiB, the node's limit

    def check(err: BrokerError) -> None:
        assert isinstance(err, ResourceExhausted) and err.reason == "REQUEST_TOO_LARGE" and err.refused, err
        assert "larger than max" not in err.message, err.message
        assert err.message.startswith(f"the request is {int(err.metadata['size_bytes'])} bytes as one gRPC "
                                      "message, over the node's limit of "), err.message
        assert int(err.metadata["size_bytes"]) > len(schema) > int(err.metadata["limit_bytes"])

    with Client(cluster.addresses) as sync:
        with pytest.raises(BrokerError) as caught:
            sync.create_topic("sdk-too-large", 1, schema=schema)
        check(caught.value)
        assert "sdk-too-large" not in [t.name for t in sync.list_topics()]

    async def main() -> BrokerError:
        async with AsyncClient(cluster.addresses) as c:
            with pytest.raises(BrokerError) as caught:
                await c.create_topic("sdk-too-large", 1, schema=schema)
            return caught.value

    check(asyncio.run(main()))
