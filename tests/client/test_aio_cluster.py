"""The asyncio SDK against a real 3-node cluster: topics, publish, subscribe, groups, admin, on_event."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from broker.client import Batch, Client, Event, Record, TopicExists, TopicNotFound
from broker.client.aio import AsyncClient, AsyncMessage
from broker.client.aio.routing import AsyncCall
from broker.client.errors import InvalidArgument
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
T = TypeVar("T")


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_topics_publish_and_subscribe_match_the_sync_client(
        cluster: DevCluster, run: Callable[[Coroutine[Any, Any, None]], None]) -> None:
    """On asyncio's own event loop and on uvloop's (which many services run)."""
    seen: list[tuple[str, object]] = []

    async def main() -> None:
        async with AsyncClient(cluster.addresses, on_event=lambda kind, item: seen.append((kind, item))) as c:
            info = await c.create_topic("aio-t", 2)
            assert info.partition_count == 2
            assert (await c.create_topic("aio-t", 2, exist_ok=True)).name == "aio-t"
            with pytest.raises(TopicExists):
                await c.create_topic("aio-t", 3, exist_ok=True)
            assert "aio-t" in [t.name for t in await c.list_topics()]
            first = await c.publish("aio-t", "one", partition=0, idempotency_key="k1")
            again = await c.publish("aio-t", "one", partition=0, idempotency_key="k1")
            assert again.duplicate and again.offset == first.offset
            results = await c.publish_batch("aio-t", [{"value": f"v{i}", "partition": i % 2} for i in range(6)])
            assert [r.partition for r in results] == [0, 1, 0, 1, 0, 1]
            got = [r async for r in c.subscribe("aio-t", stop_at_end=True) if isinstance(r, Record)]
            assert sorted(r.value for r in got) == sorted([b"one"] + [f"v{i}".encode() for i in range(6)])
            with pytest.raises(TopicNotFound):
                await c.describe_topic("aio-none")
            with pytest.raises(InvalidArgument):
                await c.create_topic("bad name!", 1)
            with pytest.raises(TopicNotFound):
                async for _ in c.subscribe("aio-none"):
                    pass
            with pytest.raises(InvalidArgument):
                async for _ in c.subscribe("aio-t", partition=5):
                    pass
            assert await c.prune("aio-t", 1, partition=0) == 1
            status = await c.cluster_status()
            assert len(status.nodes) == 3 and status.leader_id
            await c.drop_topic("aio-t")
            with pytest.raises(TopicNotFound):
                await c.describe_topic("aio-t")

    run(main())
    kinds = {k for k, _ in seen}
    assert {"published", "record"} <= kinds
    records = [item for k, item in seen if k == "record"]
    assert len(records) == 7, "on_event saw each delivered (committed) record once"


def test_async_batches_carry_what_the_sync_ones_do(cluster: DevCluster) -> None:
    seen: list[str] = []
    with Client(cluster.addresses) as sync:
        sync.create_topic("aio-b", 2)
        sync.publish_batch("aio-b", [{"value": f"v{i}", "key": f"k{i}", "partition": i % 2} for i in range(40)])
        want = sorted((b.partition, b.first_offset, tuple(b.values), tuple(b.keys()))
                      for b in sync.subscribe_batches("aio-b", stop_at_end=True, max_batch=7) if isinstance(b, Batch))

    async def main() -> tuple[list[tuple[int, int, tuple[bytes, ...], tuple[bytes | None, ...]]], list[int]]:
        async with AsyncClient(cluster.addresses, on_event=lambda kind, item: seen.append(kind)) as c:
            got = [(b.partition, b.first_offset, tuple(b.values), tuple(b.keys()))
                   async for b in c.subscribe_batches("aio-b", stop_at_end=True, max_batch=7) if isinstance(b, Batch)]
            first = None
            async with c.subscribe_batches("aio-b", partition=1, max_batch=7, stop_at_end=True) as sub:
                async for item in sub:
                    if isinstance(item, Batch):
                        first = item
                        break
            assert first is not None and list(first.offsets) == list(range(7))
            rest = c.subscribe_batches("aio-b", partition=1, start=first.next_position, stop_at_end=True)
            resumed = [o async for b in rest if isinstance(b, Batch) for o in b.offsets]
            with pytest.raises(InvalidArgument):
                c.subscribe_batches("aio-b", max_batch=-1)
            return sorted(got), resumed

    got, resumed = asyncio.run(main())
    assert got == want and sum(len(v) for _, _, v, _ in got) == 40
    assert resumed == list(range(7, 20)), "next_position resumes right after the batch"
    assert "batch" in seen and "record" not in seen


def test_sync_and_async_clients_read_each_others_writes(cluster: DevCluster) -> None:
    with Client(cluster.addresses) as sync:
        sync.create_topic("aio-x", 1)
        sync.publish("aio-x", "from-sync")

    async def main() -> list[bytes]:
        async with AsyncClient(cluster.addresses) as c:
            await c.publish("aio-x", "from-async")
            return [r.value async for r in c.subscribe("aio-x", stop_at_end=True) if isinstance(r, Record)]

    assert asyncio.run(main()) == [b"from-sync", b"from-async"]


def test_queue_group_claim_ack_nack_extend_and_run_with_concurrency(cluster: DevCluster) -> None:
    async def main() -> None:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("aio-q", 2)
            await c.publish_batch("aio-q", [f"job{i}" for i in range(20)])
            claimed = await c.claim("aio-q", "workers", max_records=5, visibility_ms=60_000)
            assert len(claimed) == 5
            deadlines = await claimed[0].extend(120_000)
            assert deadlines > 0
            await claimed[0].ack()
            await claimed[1].nack(delay_ms=0)
            others = await c.claim("aio-q", "workers", max_records=20)
            held = {(m.partition, m.offset) for m in claimed[2:]}
            assert not held & {(m.partition, m.offset) for m in others}, "a claimed lease is not handed out twice"
            for m in others:
                await m.ack()
            nacked = (claimed[1].partition, claimed[1].offset)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while nacked not in {(m.partition, m.offset) for m in others}:  # back after the group's backoff
                assert loop.time() < deadline, "the nacked record was never delivered again"
                again = await c.claim("aio-q", "workers", max_records=20)
                for m in again:
                    await m.ack()
                others += again
                await asyncio.sleep(0.2)
            for m in claimed[2:]:
                await m.ack()
            lag = await c.group_lag("aio-q", "workers")
            assert lag.lag == 0

            await c.publish_batch("aio-q", [f"more{i}" for i in range(12)])
            active = 0
            peak = 0
            handled: list[bytes] = []

            async def handler(m: AsyncMessage) -> None:
                nonlocal active, peak
                active += 1
                peak = max(peak, active)
                await asyncio.sleep(0.05)
                handled.append(m.value)
                active -= 1

            n = await c.run("aio-q", group="workers", handler=handler, concurrency=4, limit=12)
            assert n == 12 and sorted(handled) == sorted(f"more{i}".encode() for i in range(12))
            assert peak > 1, "handlers ran concurrently"

    asyncio.run(main())


def test_stream_group_consumer_reports_its_partitions(cluster: DevCluster) -> None:
    seen: list[tuple[str, object]] = []

    async def main() -> None:
        async with AsyncClient(cluster.addresses, on_event=lambda k, i: seen.append((k, i))) as c:
            await c.create_topic("aio-s", 3)
            await c.publish_batch("aio-s", [{"value": f"s{i}", "partition": i % 3} for i in range(9)])
            got: list[bytes] = []
            async with c.consumer("aio-s", "readers", mode="stream") as consumer:
                async for item in consumer:
                    if isinstance(item, AsyncMessage):
                        got.append(item.value)
                        await item.ack()
                    if len(got) == 9:
                        break
                assert consumer.assigned == (0, 1, 2)
            assert sorted(got) == sorted(f"s{i}".encode() for i in range(9))

    asyncio.run(main())
    assert ("rebalance", (0, 1, 2)) in seen
    assert len([1 for k, _ in seen if k == "message"]) == 9


def test_publish_batch_back_pressure_bounds_the_calls_in_flight(cluster: DevCluster) -> None:
    async def main() -> int:
        async with AsyncClient(cluster.addresses, max_in_flight_batches=2) as c:
            await c.create_topic("aio-bp", 1)
            router = c._router
            real_call = router.call
            active = peak = 0

            async def counting(fn: AsyncCall[T], *, write: bool, what: str) -> T:
                nonlocal active, peak
                active += 1
                peak = max(peak, active)
                try:
                    return await real_call(fn, write=write, what=what)
                finally:
                    active -= 1

            router.call = counting  # type: ignore[method-assign]
            results = await asyncio.gather(*(c.publish_batch("aio-bp", [f"b{i}-{j}" for j in range(5)])
                                             for i in range(10)))
            router.call = real_call  # type: ignore[method-assign]
            assert sorted(r.offset for batch in results for r in batch) == list(range(50))
            return peak

    assert asyncio.run(main()) == 2, "at most max_in_flight_batches publish calls at once, and they overlap"


def test_run_in_stream_mode_keeps_each_partitions_order(cluster: DevCluster) -> None:
    async def main() -> list[tuple[int, int]]:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("aio-order", 3)
            await c.publish_batch("aio-order", [{"value": f"o{i}", "partition": i % 3} for i in range(30)])
            order: list[tuple[int, int]] = []

            async def handler(m: AsyncMessage) -> None:
                await asyncio.sleep(0.02 if m.offset % 2 else 0.0)  # later records would overtake earlier ones
                order.append((m.partition, m.offset))

            assert await c.run("aio-order", group="ordered", mode="stream", handler=handler, concurrency=6,
                               limit=30) == 30
            return order

    order = asyncio.run(main())
    for p in range(3):
        offsets = [o for q, o in order if q == p]
        assert offsets == list(range(10)), f"partition {p} handled in order"


def _acks_started(metrics_address: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "raftbroker_grpc_server_started_total" and sample.labels.get("grpc_method") == "Ack")


def _open_streams(metrics_address: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "raftbroker_subscribers")


async def _a_claimed_then_a_and_b_pruned(c: AsyncClient, topic: str, metrics: str) -> AsyncMessage:
    """``topic`` gets a, b, c, d; group ``w`` claims a (returned, leased for a minute) and its
    stream closes; then a and b are pruned."""
    await c.create_topic(topic, 1)
    await c.publish_batch(topic, ["a", "b", "c", "d"])
    before = _open_streams(metrics)  # streams of earlier tests may still be closing on a busy machine
    [claimed] = await c.claim(topic, "w", max_records=1, visibility_ms=60_000)
    assert claimed.value == b"a"
    wait_until(lambda: _open_streams(metrics) <= before, 30, "the claim's stream to close on the leader")
    assert await c.prune(topic, 2, partition=0) == 2
    return claimed


def test_a_prune_no_stream_saw_before_an_ack_is_told_to_the_next_member(cluster: DevCluster) -> None:
    """SPEC §3.3, never silent data loss: a record is claimed, the records up to offset 2 are
    pruned while no stream of the group is open, and the claimed one is acked. The next member must
    get SKIP_FORWARD for the record nobody received (offset 1) before the later records. Before the
    fix the ack's settle moved the group past the pruned records at once, and the member got the
    later records with no event."""
    leader = cluster.addresses.index(cluster.wait_ready())
    metrics = cluster.metrics_address(leader)

    async def main() -> list[object]:
        async with AsyncClient(cluster.addresses) as c:
            claimed = await _a_claimed_then_a_and_b_pruned(c, "aio-pruned", metrics)
            assert await claimed.ack()
            items: list[object] = []
            async with c.consumer("aio-pruned", "w", stop_at_end=True) as consumer:
                async for item in consumer:
                    items.append(item)
                    if isinstance(item, AsyncMessage):
                        await item.ack()
            return items

    items = asyncio.run(main())
    event = items[0]
    assert isinstance(event, Event) and event.type == "skip_forward", items
    assert (event.offset_before, event.offset_after) == (1, 2)
    assert [m.value for m in items[1:] if isinstance(m, AsyncMessage)] == [b"c", b"d"]


def test_a_skip_forward_sent_to_a_client_that_settled_nothing_after_it_is_told_again(cluster: DevCluster) -> None:
    """SPEC §3.3: an event sent is not one received. After a prune, a claim's stream is sent
    SKIP_FORWARD with the next record, and its client settles nothing after it (as one whose
    connection broke would); then a record leased before the prune is acked. That ack must not move
    the group past the pruned records: the next member is told again, and its ack of what followed
    the event commits past them. Before, the event sent counted as told: the ack committed past the
    gap and the next member got no event."""
    leader = cluster.addresses.index(cluster.wait_ready())
    metrics = cluster.metrics_address(leader)

    async def main() -> tuple[int, list[object], int]:
        async with AsyncClient(cluster.addresses) as c:
            held = await _a_claimed_then_a_and_b_pruned(c, "aio-unheard", metrics)
            before = _open_streams(metrics)
            claimed = await c.claim("aio-unheard", "w", max_records=1, visibility_ms=500)
            assert [m.value for m in claimed] == [b"c"]
            assert [(e.type, e.offset_before, e.offset_after) for e in claimed.events] == [("skip_forward", 0, 2)]
            wait_until(lambda: _open_streams(metrics) <= before, 30, "the second claim's stream to close on the leader")
            assert await held.ack()
            committed = (await c.group_lag("aio-unheard", "w")).partitions[0].committed
            items: list[object] = []

            async def take() -> None:
                async with c.consumer("aio-unheard", "w") as consumer:
                    async for item in consumer:
                        items.append(item)
                        if isinstance(item, AsyncMessage):
                            await item.ack()
                            if {b"c", b"d"} <= {m.value for m in items if isinstance(m, AsyncMessage)}:
                                return

            await asyncio.wait_for(take(), 60)  # c comes again once its 500 ms lease has run out
            return committed, items, (await c.group_lag("aio-unheard", "w")).partitions[0].committed

    committed, items, after = asyncio.run(main())
    assert committed == 1, "the ack of a record leased before the event does not count the gap as told"
    event = items[0]
    assert isinstance(event, Event) and event.type == "skip_forward", items
    assert (event.offset_before, event.offset_after) == (1, 2)
    assert sorted(m.value for m in items[1:] if isinstance(m, AsyncMessage)) == [b"c", b"d"]
    assert after == 4


def test_run_logs_the_records_pruned_before_anyone_received_them(cluster: DevCluster,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """``AsyncClient.run`` hands its handler messages only: a group's SKIP_FORWARD is a logged
    warning, never dropped (SPEC §3.3)."""
    cluster.wait_ready()

    async def main() -> tuple[int, int]:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("aio-lost-run", 1)
            await c.publish_batch("aio-lost-run", [f"r{i}" for i in range(6)])
            [first] = await c.claim("aio-lost-run", "w")
            assert await first.ack()
            assert await c.prune("aio-lost-run", 4, partition=0) == 4  # 1-3 go before the group received them

            async def handler(m: AsyncMessage) -> None:
                pass

            n = await c.run("aio-lost-run", group="w", handler=handler, stop_at_end=True)
            return n, (await c.group_lag("aio-lost-run", "w")).partitions[0].committed

    with caplog.at_level("WARNING", logger="broker.client.handlers"):
        handled, committed = asyncio.run(main())
    assert handled == 2 and committed == 6
    warned = [r.getMessage() for r in caplog.records if "skip_forward" in r.getMessage()]
    assert len(warned) == 1 and "aio-lost-run" in warned[0], caplog.text


def test_concurrent_acks_of_a_consumer_share_requests_and_settle_every_message(cluster: DevCluster) -> None:
    """``run`` with 32 handlers acking one message each: every message settled once, in far fewer
    ``Ack`` calls than messages (counted by the leader's own RPC counter)."""
    leader = cluster.addresses.index(cluster.wait_ready())

    async def main() -> tuple[int, int, list[bytes]]:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("aio-acks", 2)
            await c.publish_batch("aio-acks", [{"value": f"a{i}", "partition": i % 2} for i in range(400)])
            handled: list[bytes] = []

            async def handler(m: AsyncMessage) -> None:
                handled.append(m.value)

            n = await c.run("aio-acks", group="acks", handler=handler, concurrency=32, limit=400)
            lag = await c.group_lag("aio-acks", "acks")
            return n, sum(p.lag + p.in_flight + p.retrying for p in lag.partitions), handled

    before = _acks_started(cluster.metrics_address(leader))
    n, unsettled, handled = asyncio.run(main())
    calls = _acks_started(cluster.metrics_address(leader)) - before
    assert n == 400 and sorted(handled) == sorted(f"a{i}".encode() for i in range(400))
    assert unsettled == 0, "every message was settled"
    assert 1 <= calls <= 200, f"{calls:.0f} Ack calls for 400 acks: concurrent acks share requests"


def test_each_ack_tells_whether_it_settled_its_own_message_while_sharing_requests(cluster: DevCluster) -> None:
    """Handlers that ack themselves, 16 at a time: every ``await message.ack()`` answers True (its
    own record settled, though its request was shared); acking again answers False, as in the sync
    SDK; ``AsyncConsumer.ack`` counts what it settled."""
    cluster.wait_ready()

    async def main() -> tuple[list[bool], list[bool], int]:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("aio-ack-answers", 2)
            await c.publish_batch("aio-ack-answers", [{"value": f"a{i}", "partition": i % 2} for i in range(202)])
            answers: list[bool] = []
            again: list[bool] = []

            async def handler(m: AsyncMessage) -> None:
                answers.append(await m.ack())
                again.append(await m.ack())

            assert await c.run("aio-ack-answers", group="answers", handler=handler, concurrency=16, limit=200) == 200
            async with c.consumer("aio-ack-answers", "answers") as consumer:
                left: list[AsyncMessage] = []
                async for item in consumer:
                    if isinstance(item, AsyncMessage):
                        left.append(item)
                    if len(left) == 2:
                        break
                counted = await consumer.ack(left + left)
            return answers, again, counted

    answers, again, counted = asyncio.run(main())
    assert answers == [True] * 200 and again == [False] * 200
    assert counted == 2, "the two messages left, each counted once"


def test_a_cancelled_run_stops_its_handlers_and_their_records_come_again(cluster: DevCluster) -> None:
    """``run`` cancelled while 8 handlers are blocked: it ends only once every one of them was cancelled
    (no task of it keeps running), nothing was acked, and a later ``run`` gets all 8 records again once
    their leases run out."""

    async def main() -> tuple[int, int, list[bytes]]:
        async with AsyncClient(cluster.addresses) as c:
            await c.create_topic("aio-cancel", 1)
            await c.publish_batch("aio-cancel", [f"c{i}" for i in range(8)])
            started = asyncio.Event()
            blocked: list[AsyncMessage] = []
            cancelled = 0

            async def stuck(m: AsyncMessage) -> None:
                nonlocal cancelled
                blocked.append(m)
                if len(blocked) == 8:
                    started.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    cancelled += 1
                    raise

            config: dict[str, Any] = {"visibility_timeout_ms": 1000, "mode": "queue"}
            runner = asyncio.create_task(c.run("aio-cancel", group="cancel", handler=stuck, concurrency=8,
                                               **config))
            await asyncio.wait_for(started.wait(), 30)
            others = asyncio.all_tasks() - {asyncio.current_task(), runner}
            runner.cancel()
            with pytest.raises(asyncio.CancelledError):
                await runner
            handlers_left = sum(1 for t in asyncio.all_tasks() - others if not t.done()) - 1  # minus main()
            again: list[bytes] = []

            async def handler(m: AsyncMessage) -> None:
                again.append(m.value)

            await asyncio.wait_for(c.run("aio-cancel", group="cancel", handler=handler, concurrency=8, limit=8,
                                         **config), 60)
            return cancelled, handlers_left, again

    cancelled, handlers_left, again = asyncio.run(main())
    assert cancelled == 8, "every blocked handler was cancelled"
    assert handlers_left == 0, "no task of the cancelled run is left running"
    assert sorted(again) == sorted(f"c{i}".encode() for i in range(8)), "the unacked records came again"
