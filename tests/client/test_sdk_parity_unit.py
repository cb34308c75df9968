"""The two SDKs refuse the same bad arguments with the same error (no server needed: these are
checked before anything is sent). Before, the sync ``run`` gave one message for three arguments and
took ``concurrency=True``, and an unknown group option was Python's TypeError in both."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from broker.client import Client, InvalidArgument, Message
from broker.client.aio import AsyncClient, AsyncMessage

pytestmark = pytest.mark.unit

NOWHERE = ["127.0.0.1:1"]


@pytest.mark.parametrize(("options", "said"), [
    ({"concurrency": 0}, "concurrency must be between 1 and 2**32 - 1, got 0"),
    ({"concurrency": True}, "concurrency must be an int, got bool True"),
    ({"batch_size": 0}, "batch_size must be between 1 and 2**32 - 1, got 0"),
    ({"limit": 0}, "limit must be between 1 and 2**63 - 1, got 0"),
    ({"bogus": 1}, "unknown group option(s) ['bogus']"),
])
def test_run_refuses_the_same_arguments_alike(options: dict[str, Any], said: str) -> None:
    def handle(message: Message) -> None:
        return None

    async def handle_async(message: AsyncMessage) -> None:
        return None

    with Client(NOWHERE) as client, pytest.raises(InvalidArgument) as sync_error:
        client.run("t", group="g", handler=handle, **options)

    async def run_async() -> None:
        async with AsyncClient(NOWHERE) as client:
            await client.run("t", group="g", handler=handle_async, **options)

    with pytest.raises(InvalidArgument) as async_error:
        asyncio.run(run_async())
    assert said in sync_error.value.message and sync_error.value.message == async_error.value.message


def test_an_unknown_group_option_is_invalid_argument_in_both() -> None:
    with Client(NOWHERE) as client, pytest.raises(InvalidArgument, match=r"unknown group option\(s\) \['bogus'\]"):
        client.subscribe("t", group="g", bogus=1)

    async def consume() -> None:
        async with AsyncClient(NOWHERE) as client:
            client.consumer("t", "g", bogus=1)

    with pytest.raises(InvalidArgument, match=r"unknown group option\(s\) \['bogus'\]"):
        asyncio.run(consume())


@pytest.mark.parametrize("options", [{"timeout_s": 0}, {"retry_deadline_s": -1}, {"no_quorum_grace_s": 61}])
def test_both_clients_refuse_the_same_settings_alike(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as sync_error:
        Client(NOWHERE, **options)
    with pytest.raises(ValueError) as async_error:
        AsyncClient(NOWHERE, **options)
    assert str(sync_error.value) == str(async_error.value)
    with pytest.raises(ValueError, match="give bootstrap addresses"):
        AsyncClient(None)  # type: ignore[arg-type]
