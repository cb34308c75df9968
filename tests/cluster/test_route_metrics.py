"""Metrics of deletions and routes on every node: records deleted by prune and by retention,
and each route's lag (from the replicated cursors) and the leader's copied count."""

from __future__ import annotations

import re
import urllib.request

import pytest

from broker.client import Client
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def scrape(address: str) -> str:
    return urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        match = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


def test_deletions_and_route_lag_are_exported(cluster: DevCluster) -> None:
    leader = cluster.leader()
    assert leader is not None
    before = [sample(scrape(cluster.metrics_address(i)), "raftbroker_records_deleted_total", reason="prune") or 0
              for i in range(cluster.nodes)]
    with Client(cluster.addresses) as client:
        client.create_topic("m-src", retention={"max_records": 5})
        client.create_topic("m-dst")
        client.publish_batch("m-src", [b"%d" % i for i in range(12)])  # discard_old keeps the last 5
        assert client.prune("m-src", 9) == 2
        client.create_route("m-route", "m-src", "m-dst", filter="false")
        wait_until(lambda: client.route("m-route").lag == 0, 30, "the route to catch up")
    for i in range(cluster.nodes):  # every node applied the same deletions
        def counted(i: int = i) -> bool:
            text = scrape(cluster.metrics_address(i))
            pruned = sample(text, "raftbroker_records_deleted_total", reason="prune")
            expired = sample(text, "raftbroker_records_deleted_total", reason="retention")
            lag = sample(text, "raftbroker_route_lag_records", route="m-route", source="m-src", target="m-dst")
            return pruned == before[i] + 2 and (expired or 0) >= 7 and lag == 0
        wait_until(counted, 30, f"node {i} to export the deletions and the route lag")
    text = scrape(cluster.metrics_address(leader))
    # 9 records were deleted before the route existed, 3 did not pass the filter
    assert sample(text, "raftbroker_route_skipped_records_total", route="m-route") == 12
    # of them, the 9 deleted before they were routed are lost, told apart from the filter's 3
    assert sample(text, "raftbroker_route_lost_records_total", route="m-route") == 9
    assert sample(text, "raftbroker_route_copied_records_total", route="m-route") == 0
