"""Both SDKs refuse bad arguments with InvalidArgument (naming the argument and the type or range it
needs) before anything is sent or leased; no server runs here: a call that got past its checks
would find no node at the bootstrap address and end in UNAVAILABLE instead."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from broker.client import Client, InvalidArgument, checks
from broker.client.aio import AsyncClient, AsyncConsumer
from broker.core.groups import config as server_groups

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def nowhere() -> str:
    """An address where nothing listens (a port taken and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def sync(nowhere: str) -> Iterator[Client]:
    with Client([nowhere], timeout_s=0.5, retry_deadline_s=1, no_quorum_grace_s=0.2) as c:
        yield c


def in_async(nowhere: str, act: Callable[[AsyncClient], Awaitable[object]]) -> object:
    async def main() -> object:
        async with AsyncClient([nowhere], timeout_s=0.5, retry_deadline_s=1, no_quorum_grace_s=0.2) as c:
            return await act(c)
    return asyncio.run(main())


# -- the client's copies of server rules ------------------------------------------------------------

def test_the_client_copies_of_group_rules_equal_the_server_definitions() -> None:
    assert checks.GROUP_NAME_RE.pattern == server_groups.GROUP_NAME_RE.pattern
    assert checks.EXTEND_MAX_MS == server_groups.EXTEND_MAX_MS
    assert checks.NACK_DELAY_MAX_MS == server_groups.NACK_DELAY_MAX_MS


# -- defect 7: wrong types ---------------------------------------------------------------------------

BAD_PUBLISHES: list[tuple[dict[str, Any], str]] = [
    ({"partition": "1"}, "partition must be an int, got str"),
    ({"partition": True}, "partition must be an int, got bool"),
    ({"headers": [("a", "b")]}, "headers must be a dict"),
]


@pytest.mark.parametrize(("kwargs", "said"), BAD_PUBLISHES)
def test_publish_with_a_wrong_type_is_invalid_argument_in_both_sdks(
        sync: Client, nowhere: str, kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        sync.publish("t", b"x", **kwargs)
    with pytest.raises(InvalidArgument, match=said):
        in_async(nowhere, lambda c: c.publish("t", b"x", **kwargs))


@pytest.mark.parametrize("batch", ["abc", b"abc", {"value": b"x"}], ids=["str", "bytes", "dict"])
def test_publish_batch_refuses_one_value_as_the_batch(sync: Client, nowhere: str, batch: Any) -> None:
    with pytest.raises(InvalidArgument, match="give a list of records"):
        sync.publish_batch("t", batch)
    with pytest.raises(InvalidArgument, match="give a list of records"):
        in_async(nowhere, lambda c: c.publish_batch("t", batch))


BAD_TOPICS: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
    ((5,), {}, r"name \(the topic name\) must be a str, got int"),
    (("t",), {"dedup_fields": [1, 2]}, r"dedup_fields\[0\] must be a str, got int"),
    (("t",), {"dedup_fields": 5}, "dedup_fields must be a sequence of field names"),
    (("t",), {"retention": {"max_records": "5"}}, "retention max_records must be an int, got str"),
    (("t",), {"retention": 5}, "retention must be a dict or a Retention"),
    (("t",), {"schema": ["not", "a", "schema"]}, "schema must be a dict or JSON text"),
]


@pytest.mark.parametrize(("args", "kwargs", "said"), BAD_TOPICS)
def test_create_topic_with_a_wrong_type_is_invalid_argument_in_both_sdks(
        sync: Client, nowhere: str, args: tuple[Any, ...], kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        sync.create_topic(*args, **kwargs)
    with pytest.raises(InvalidArgument, match=said):
        in_async(nowhere, lambda c: c.create_topic(*args, **kwargs))


def test_a_claim_naming_stream_mode_is_refused_before_anything_is_leased(nowhere: str) -> None:
    with pytest.raises(InvalidArgument, match="claim is for queue-mode groups"):
        in_async(nowhere, lambda c: c.claim("t", "g", mode="stream"))


def test_a_session_timeout_for_a_queue_mode_group_is_refused(sync: Client) -> None:
    """Queue-mode members have no sessions: the value was stored and never used."""
    with pytest.raises(InvalidArgument, match="session_timeout_ms applies to stream mode"):
        sync.groups.create("t", "g", "queue", session_timeout_ms=5000)
    with pytest.raises(InvalidArgument, match="session_timeout_ms applies to stream mode"):
        sync.subscribe("t", group="g", mode="queue", session_timeout_ms=5000)


# -- defect 3: group names ---------------------------------------------------------------------------

@pytest.mark.parametrize("group", ["", "-lead", "a.b", "x" * 101, 5])
def test_run_with_an_invalid_group_name_is_refused_before_subscribing(sync: Client, nowhere: str,
                                                                      group: Any) -> None:
    handled: list[object] = []

    async def handler(message: object) -> None:
        handled.append(message)

    with pytest.raises(InvalidArgument, match="group"):
        sync.run("t", group=group, handler=handled.append, stop_at_end=True)
    with pytest.raises(InvalidArgument, match="group"):
        in_async(nowhere, lambda c: c.run("t", group=group, handler=handler, stop_at_end=True))
    with pytest.raises(InvalidArgument, match="group"):
        sync.subscribe("t", group=group)
    assert not handled


# -- defect 2: claim and settle arguments ------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "said"), [
    ({"visibility_ms": 10**14}, "visibility_ms must be between 1 and 43200000"),
    ({"visibility_ms": 0}, "visibility_ms must be between 1"),
    ({"visibility_ms": "5"}, "visibility_ms must be an int"),
    ({"max_records": 0}, "max_records must be between 1 and 1000"),
    ({"max_records": 1.5}, "max_records must be an int"),
    ({"visibility_timeout_ms": -1}, "visibility_timeout_ms must be a positive int"),
    ({"max_batch": 3}, "claim sets max_batch itself"),
])
def test_claim_checks_every_argument_before_leasing(nowhere: str, kwargs: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidArgument, match=said):
        in_async(nowhere, lambda c: c.claim("t", "g", **kwargs))


def test_nack_delay_and_extend_lengths_out_of_the_server_range_are_refused_before_sending(
        sync: Client, nowhere: str) -> None:
    consumer = sync.subscribe("t", group="g")
    with pytest.raises(InvalidArgument, match="delay_ms must be between 0 and 43200000"):
        consumer.nack([], delay_ms=10**14)
    with pytest.raises(InvalidArgument, match="lease's length"):
        consumer.extend([], 10**14)
    consumer.close()

    async def act(c: AsyncClient) -> None:
        aconsumer = c.consumer("t", "g")
        with pytest.raises(InvalidArgument, match="delay_ms must be between 0"):
            await aconsumer.nack([], delay_ms=10**14)
        with pytest.raises(InvalidArgument, match="lease's length"):
            await aconsumer.extend([], 10**14)
        with pytest.raises(InvalidArgument, match="extend_ms must be between 0"):
            await c.settle("extend", "t", "g", [b"p"], extend_ms=10**14)
    in_async(nowhere, act)


# -- defect 5: the asyncio surface -------------------------------------------------------------------

def test_async_subscribe_with_a_group_is_a_consumer_as_in_the_sync_sdk(nowhere: str) -> None:
    async def act(c: AsyncClient) -> None:
        consumer = c.subscribe("t", group="g", mode="stream", visibility_timeout_ms=1000)
        assert isinstance(consumer, AsyncConsumer) and consumer.group == "g"
        with pytest.raises(InvalidArgument, match="drop partition"):
            c.subscribe("t", group="g", partition=1)
        with pytest.raises(InvalidArgument, match="group options need group"):
            c.subscribe("t", mode="stream")
    in_async(nowhere, act)


def test_async_publish_takes_the_sync_session_arguments(sync: Client, nowhere: str) -> None:
    """``dedup_id`` and ``msg_id`` are accepted and checked as in the sync SDK (here: refused the same
    way when msg_id comes without dedup_id, before anything is sent)."""
    with pytest.raises(InvalidArgument, match="need a dedup_id"):
        sync.publish("t", b"x", msg_id=1)
    with pytest.raises(InvalidArgument, match="need a dedup_id"):
        in_async(nowhere, lambda c: c.publish("t", b"x", msg_id=1))
    with pytest.raises(InvalidArgument, match="dedup_id must have 1 to"):
        in_async(nowhere, lambda c: c.publish("t", b"x", dedup_id="", msg_id=1))


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"ack": "later"}, "ack must be 'auto' or 'manual'"),
    ({"batch_size": 0}, "batch_size must be between 1"),
    ({"concurrency": 0}, "concurrency must be between 1"),
    ({"stop": asyncio.Event}, "cancel the task awaiting run"),
])
def test_async_run_checks_the_sync_arguments(nowhere: str, kwargs: dict[str, Any], said: str) -> None:
    async def handler(message: object) -> None:
        pass

    with pytest.raises(InvalidArgument, match=said):
        in_async(nowhere, lambda c: c.run("t", group="g", handler=handler, **kwargs))


# -- a negative max_batch and commit position -------------------------------------------------------

def test_a_negative_max_batch_and_a_commit_out_of_range_are_invalid_argument_naming_them(
        sync: Client, nowhere: str) -> None:
    """Before: protobuf's bare ``ValueError: Value out of range: -1``, naming nothing."""
    with pytest.raises(InvalidArgument, match="max_batch must be between 0 and 2"):
        sync.subscribe("t", group="g", max_batch=-1)
    with pytest.raises(InvalidArgument, match="max_batch must be between 0 and 2"):
        in_async(nowhere, lambda c: c.consumer("t", "g", max_batch=-1).stop())
    consumer = sync.subscribe("t", group="g", mode="stream")
    with pytest.raises(InvalidArgument, match="offset must be between 0 and 2"):
        consumer.commit(0, -1)
    with pytest.raises(InvalidArgument, match="offset must be between 0 and 2"):
        consumer.commit(0, 2**64)
    with pytest.raises(InvalidArgument, match="partition must be between 0 and 2"):
        consumer.commit(-1, 0)
    consumer.close()
