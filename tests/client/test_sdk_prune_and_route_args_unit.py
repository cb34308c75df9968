"""The SDK refuses arguments that used to mean something else than the caller said, before
anything is sent (no server runs here: a call past its checks would end in UNAVAILABLE):
``prune(topic, 0, group=G)`` ("no further than 0" became "no bound" on the wire),
``create_route(..., ops="insert")`` (iterated letter by letter: "unknown op 'i'"), and a retention
cap below 1 (said to need "between -2**63 and 2**63 - 1", then refused by the server)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from broker.client import Client, InvalidArgument
from broker.client.aio import AsyncClient

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture
def nowhere() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def client(nowhere: str) -> Iterator[Client]:
    with Client([nowhere], timeout_s=0.5, retry_deadline_s=1, no_quorum_grace_s=0.2) as c:
        yield c


def test_prune_by_a_group_before_offset_0_is_refused(client: Client, nowhere: str) -> None:
    with pytest.raises(InvalidArgument, match="before_offset 0 with a group would delete nothing"):
        client.prune("t", 0, group="archiver")

    async def in_async() -> None:  # the asyncio SDK (and the HTTP gateway, which calls it) check alike
        async with AsyncClient([nowhere], timeout_s=0.5, retry_deadline_s=1, no_quorum_grace_s=0.2) as c:
            await c.prune("t", 0, group="archiver")

    with pytest.raises(InvalidArgument, match="before_offset 0 with a group would delete nothing"):
        asyncio.run(in_async())


def test_create_route_with_ops_as_one_str_is_refused_by_name(client: Client) -> None:
    with pytest.raises(InvalidArgument, match=r"ops must be a list of op names \(e\.g\. \['insert'\]\)"):
        client.create_route("r", "a", "b", ops="insert")


@pytest.mark.parametrize("cap", [0, -1])
def test_a_retention_cap_below_1_is_refused_with_the_range_it_needs(client: Client, cap: int) -> None:
    """The range said is the one a cap has (1 and up; None: no cap), not int64's -2**63."""
    with pytest.raises(InvalidArgument, match=rf"retention max_records must be between 1 and 2\*\*63 - 1, got {cap}"):
        client.create_topic("t", 1, retention={"max_records": cap})
    with pytest.raises(InvalidArgument, match=rf"retention max_bytes must be between 1 and 2\*\*63 - 1, got {cap}"):
        client.alter_topic("t", retention={"max_bytes": cap})
