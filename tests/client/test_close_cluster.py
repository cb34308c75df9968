"""Closing a client while it works, on a real cluster: what callers are told, and what stops.

- ``AsyncClient.close()`` never returned while other tasks went on publishing (it waited for a queue
  they kept filling); publishes after it are now refused.
- A write cut off by ``close()`` was reported as a final CANCELLED (sync) or a bare CancelledError
  in a task nobody cancelled (asyncio), although it may have been stored: it is CANCELLED "the
  client was closed" with ``after_unknown_outcome``.
- A stream-mode member's heartbeats went on after its stream ended and after ``Client.close()``
  (a thread that beat forever, and partitions held by a member that read nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from broker.client import BrokerError, Client, Message
from broker.client.aio import AsyncClient
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def test_asyncio_close_returns_while_other_tasks_publish_and_refuses_later_publishes(cluster: DevCluster) -> None:
    async def scenario() -> BrokerError:
        client = AsyncClient(cluster.wait_ready(), retry_deadline_s=30)
        await client.create_topic("close-a", 1, exist_ok=True)

        async def publish_forever() -> BrokerError:
            while True:
                try:
                    await client.publish("close-a", b"x")
                except BrokerError as err:
                    return err

        publishers = [asyncio.create_task(publish_forever()) for _ in range(8)]
        await asyncio.sleep(0.5)
        await asyncio.wait_for(client.close(), 20)
        errors = await asyncio.wait_for(asyncio.gather(*publishers), 20)
        return errors[0]

    err = asyncio.run(scenario())
    assert err.code == "CANCELLED" and "closed" in err.message, err


def test_a_write_cut_off_by_close_says_its_outcome_is_unknown(cluster: DevCluster) -> None:
    with Client(cluster.wait_ready(), retry_deadline_s=30) as setup:
        setup.create_topic("close-s", 1, exist_ok=True)
    batch = [b"v" * 1024] * 3000
    outcomes: list[BaseException] = []
    client = Client(cluster.addresses, retry_deadline_s=30)

    def publish_until_closed() -> None:
        while True:
            try:
                client.publish_batch("close-s", batch)
            except BaseException as err:  # noqa: BLE001 - what the caller is told
                outcomes.append(err)
                return

    thread = threading.Thread(target=publish_until_closed)
    thread.start()
    wait_until(lambda: client.describe_topic("close-s").records >= 3000, 60, "a batch stored")
    client.close()
    thread.join(60)
    assert not thread.is_alive()
    err = outcomes[0]
    assert isinstance(err, BrokerError) and err.code == "CANCELLED", repr(err)
    # cut off in flight: it may have been stored; refused before it was sent: it was not
    assert err.after_unknown_outcome or "the client is closed" in err.message, err

    async def asyncio_cut_off() -> BaseException:
        aclient = AsyncClient(cluster.addresses, retry_deadline_s=30)
        task = asyncio.create_task(aclient.publish_batch("close-s", batch))
        await asyncio.sleep(0.03)
        await aclient.close()
        try:
            await task
        except BaseException as raised:  # noqa: BLE001 - what the caller is told
            return raised
        return BrokerError("OK", "stored before the close")

    raised = asyncio.run(asyncio_cut_off())
    assert not isinstance(raised, asyncio.CancelledError), "nobody cancelled the publishing task"
    assert isinstance(raised, BrokerError), repr(raised)
    assert raised.code == "OK" or raised.after_unknown_outcome or "the client is closed" in raised.message, raised


def test_a_stream_members_heartbeats_stop_with_its_stream_and_its_client(cluster: DevCluster) -> None:
    with Client(cluster.wait_ready(), retry_deadline_s=30) as client:
        client.create_topic("close-g", 2, exist_ok=True)
        client.groups.create("close-g", "s", mode="stream", session_timeout_ms=1500)
        client.publish("close-g", b"a", partition=0)
        consumer = client.subscribe("close-g", group="s", stop_at_end=True)
        assert [m.value for m in consumer if isinstance(m, Message)] == [b"a"]  # the stream ended: no more beats
        wait_until(lambda: not client.groups.describe("close-g", "s").members, 30,
                   "the member's session to end after its stream")
        again = client.subscribe("close-g", group="s")
        def read() -> None:  # joins as it reads; ends with CANCELLED when the client closes
            with contextlib.suppress(BrokerError):
                next(iter(again), None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        wait_until(lambda: client.groups.describe("close-g", "s").members, 30, "a member joined")
    # closing the client (not the consumer) ends the heartbeat thread too
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "raftbroker-heartbeat-s"], 30,
               "the heartbeat thread to end with its client")
    reader.join(30)
    again.close()
