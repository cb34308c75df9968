"""Fixtures: real 3-node clusters whose nodes also serve the HTTP gateway (``serve --http``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from broker.devcluster import DevCluster
from tests.conftest import start_cluster, wait_until


def gateway_up(address: str) -> bool:
    try:
        return httpx.get(f"http://{address}/openapi.json", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def gateways_up(cluster: DevCluster) -> None:
    for i in range(cluster.nodes):
        def up(i: int = i) -> bool:
            return gateway_up(cluster.http_address(i))

        wait_until(up, 60, f"the HTTP gateway of node {i}")


def start_http_cluster(tmp: Path) -> DevCluster:
    return start_cluster(tmp, http=True, ready=gateways_up)


@pytest.fixture(scope="module")
def http_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    c = start_http_cluster(tmp_path_factory.mktemp("http"))
    try:
        yield c
    finally:
        c.stop()


@dataclass
class SseEvent:
    event: str = "message"
    id: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)


def sse_events(lines: Iterator[str]) -> Iterator[SseEvent]:
    """Parse Server-Sent Events (comment lines are kept as their own empty events)."""
    current = SseEvent()
    for line in lines:
        if line == "":
            if current.data or current.id or current.comments:
                yield current
            current = SseEvent()
        elif line.startswith(":"):
            current.comments.append(line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                current.event = value
            elif name == "id":
                current.id = value
            elif name == "data":
                current.data += value
