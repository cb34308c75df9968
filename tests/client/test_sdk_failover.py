"""Both SDKs' failover guarantee: 20 leader kills (kill -9) while publishing concurrently, and every
acknowledged record is stored exactly once (own cluster). Half the publishers call ``publish_batch``
(unary calls), half make concurrent ``publish`` calls, which the SDKs coalesce and send on a
``PublishStream`` per topic (:mod:`broker.client.aio.publish_streams`,
:mod:`broker.client.publish_streams`). And a leader that hangs under the sync client's open stream
(SIGSTOP: its connections stay open, nothing answers): the request's deadline ends the wait and the
publish lands once on the next leader."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from broker.client import Client, Record
from broker.client.aio import AsyncClient
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
KILLS = 20
PUBLISHERS = 4


def kill_and_heal(c: DevCluster) -> None:
    """Kill the leader, wait for another to lead, restart the killed node (the majority stays)."""
    c.wait_ready(60)
    index = c.leader()
    assert index is not None
    c.kill(index)
    wait_until(lambda: c.leader() not in (None, index), 60, "a new leader")
    c.spawn(index)
    wait_until(lambda: c.node_status(index) is not None, 60, "the killed node to serve again")


def test_twenty_leader_kills_while_publishing_every_record_exactly_once(fresh_cluster: DevCluster) -> None:
    acked: list[str] = []

    async def main() -> None:
        async with AsyncClient(fresh_cluster.addresses, timeout_s=5, retry_deadline_s=90) as c:
            await c.create_topic("aio-fo", 3)
            done = asyncio.Event()

            async def publisher(n: int) -> None:
                i = 0
                while not done.is_set():
                    values = [f"p{n}-{i}-{j}" for j in range(3)]
                    if n % 2:
                        await asyncio.gather(*(c.publish("aio-fo", v) for v in values))
                    else:
                        await c.publish_batch("aio-fo", values)
                    acked.extend(values)
                    i += 1

            tasks = [asyncio.create_task(publisher(n)) for n in range(PUBLISHERS)]
            for _ in range(KILLS):
                await asyncio.to_thread(kill_and_heal, fresh_cluster)
                assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
            done.set()
            await asyncio.gather(*tasks)

    asyncio.run(main())
    with Client(fresh_cluster.addresses, retry_deadline_s=60) as client:
        stored = [r.value.decode() for r in client.subscribe("aio-fo", stop_at_end=True) if isinstance(r, Record)]
    assert len(acked) > KILLS * 3
    assert len(stored) == len(set(stored)), "no record stored twice"
    assert sorted(stored) == sorted(acked), "every acknowledged record stored, once"


def test_twenty_leader_kills_while_threads_publish_on_the_sync_client_every_record_exactly_once(
        fresh_cluster: DevCluster) -> None:
    acked: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()
    with Client(fresh_cluster.addresses, timeout_s=5, retry_deadline_s=90) as c:
        c.create_topic("sync-fo", 3)

        def publisher(n: int) -> None:
            i = 0
            try:
                while not done.is_set():
                    values = [f"p{n}-{i}-{j}" for j in range(3)]
                    if n % 2:
                        for v in values:  # one at a time; the other threads' publishes join the request
                            c.publish("sync-fo", v)
                    else:
                        c.publish_batch("sync-fo", values)
                    acked.extend(values)
                    i += 1
            except BaseException as err:  # noqa: BLE001 - reported by the assertions below
                errors.append(err)

        threads = [threading.Thread(target=publisher, args=(n,)) for n in range(2 * PUBLISHERS)]
        for t in threads:
            t.start()
        try:
            for _ in range(KILLS):
                kill_and_heal(fresh_cluster)
                assert not errors, errors
        finally:
            done.set()
            for t in threads:
                t.join(120)
        assert not errors, errors
        stored = [r.value.decode() for r in c.subscribe("sync-fo", stop_at_end=True) if isinstance(r, Record)]
    assert len(acked) > KILLS * 3
    assert len(stored) == len(set(stored)), "no record stored twice"
    assert sorted(stored) == sorted(acked), "every acknowledged record stored, once"


def test_a_leader_hung_under_the_sync_clients_open_stream_is_left_at_the_deadline(fresh_cluster: DevCluster) -> None:
    c = fresh_cluster
    with Client(c.addresses, timeout_s=2, retry_deadline_s=90) as client:
        client.create_topic("sync-hang")
        client.publish("sync-hang", "before")  # the topic's stream to the leader is open
        leader = wait_until(lambda: c.leader() is not None and str(c.leader()), 60, "a leader")
        pid = c.pids[int(str(leader))]
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            result = client.publish("sync-hang", "during")  # waits on the stream until its deadline
        finally:
            os.kill(pid, signal.SIGCONT)
        # Stored once, at its place. ``duplicate`` may be either: on a loaded machine an attempt on
        # the new leader can outlast the 2 s deadline after it was applied, and the retry of the same
        # session range then answers the original place with duplicate=True (client.py's contract).
        assert (result.partition, result.offset) == (0, 1)
        stored = [r.value for r in client.subscribe("sync-hang", stop_at_end=True) if isinstance(r, Record)]
    assert stored == [b"before", b"during"]
