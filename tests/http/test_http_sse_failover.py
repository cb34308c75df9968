"""SSE watch across leader kills (own cluster): a stream on a surviving gateway rides through the
failover behind it, and a stream whose gateway died resumes elsewhere with ``Last-Event-ID``;
in both cases nothing is missed or repeated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.devcluster import DevCluster
from tests.conftest import wait_until
from tests.http.conftest import SseEvent, gateway_up, sse_events, start_http_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture
def own_http_cluster(tmp_path: Path) -> Iterator[DevCluster]:
    c = start_http_cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()


def publish(c: DevCluster, via: int, values: list[str]) -> None:
    with httpx.Client(base_url=f"http://{c.http_address(via)}", timeout=90) as h:
        r = h.post("/v1/topics/sse/records", json={"records": [{"value": v, "partition": i % 2}
                                                              for i, v in enumerate(values)]})
        assert r.status_code == 200, r.text


def records(events: Iterator[SseEvent], n: int, seen: list[str], last_id: list[str]) -> None:
    for e in events:
        if e.event == "record":
            seen.append(json.loads(e.data)["value"])
            assert e.id
            last_id[0] = e.id
            if len(seen) >= n:
                return


def agreed_leader(c: DevCluster) -> int:
    """The leader every running node agrees on, polled with a deadline (None while they disagree)."""
    found: list[int] = []

    def agreed() -> bool:
        leader = c.leader()
        found[:] = [] if leader is None else [leader]
        return bool(found)

    wait_until(agreed, 60, "the nodes to agree on a leader")
    return found[0]


def test_sse_watch_survives_leader_kills_and_resumes_with_last_event_id(own_http_cluster: DevCluster) -> None:
    c = own_http_cluster
    leader = agreed_leader(c)
    follower = (leader + 1) % 3
    publish_values = [f"a{i}" for i in range(10)]
    with httpx.Client(base_url=f"http://{c.http_address(follower)}", timeout=60) as h:
        assert h.put("/v1/topics/sse", json={"partitions": 2}).status_code == 201
    publish(c, follower, publish_values)
    seen: list[str] = []
    last_id = [""]
    timeout = httpx.Timeout(60, read=60)
    # Phase A: the stream's gateway survives; the leader behind it is killed.
    with httpx.Client(base_url=f"http://{c.http_address(follower)}", timeout=timeout) as h, h.stream(
            "GET", "/v1/topics/sse/watch", params={"from": "earliest", "heartbeat_ms": 1000}) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        events = sse_events(stream.iter_lines())
        records(events, 10, seen, last_id)
        c.kill(leader)
        wait_until(lambda: c.leader() not in (None, leader), 60, "a new leader")
        more = [f"b{i}" for i in range(10)]
        publish(c, follower, more)
        records(events, 20, seen, last_id)
    assert sorted(seen) == sorted(publish_values + more) and len(set(seen)) == 20
    c.spawn(leader)
    wait_until(lambda: gateway_up(c.http_address(leader)), 60, "the restarted node's gateway")

    # Phase B: the stream is on the leader's own gateway, and that node is killed mid-stream.
    leader = agreed_leader(c)  # the restarted node may still be catching up: poll until all agree
    other = next(i for i in range(3) if i != leader)
    phase_b = [f"c{i}" for i in range(10)]
    publish(c, other, phase_b[:5])
    broken = False
    try:
        with httpx.Client(base_url=f"http://{c.http_address(leader)}", timeout=timeout) as h, h.stream(
                "GET", "/v1/topics/sse/watch", headers={"Last-Event-ID": last_id[0]},
                params={"heartbeat_ms": 1000}) as stream:
            events = sse_events(stream.iter_lines())
            records(events, 25, seen, last_id)
            c.kill(leader)
            for _ in events:
                pass
    except httpx.HTTPError:
        broken = True
    assert broken or not c.alive(leader), "the stream ended with its node"
    publish(c, other, phase_b[5:])
    with httpx.Client(base_url=f"http://{c.http_address(other)}", timeout=timeout) as h, h.stream(
            "GET", "/v1/topics/sse/watch", headers={"Last-Event-ID": last_id[0]},
            params={"from": "earliest", "heartbeat_ms": 1000}) as stream:
        records(sse_events(stream.iter_lines()), 30, seen, last_id)
    everything = publish_values + more + phase_b
    assert len(seen) == 30 and sorted(seen) == sorted(everything), "nothing missed, nothing repeated"
