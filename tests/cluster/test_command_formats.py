"""The cluster's command format through a rolling upgrade (docs/design/command-formats.md): real
processes, one of them running as an older release (``RAFTBROKER_TEST_APPLY_FORMAT``). The leader
never raises the format while a member cannot apply it; it raises it once the last member is
upgraded; a node downgraded past the cluster's format refuses to start, and starts again on the
newer code with nothing lost."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Client, NodeInfo
from broker.core import formats
from broker.devcluster import DevCluster
from tests.cli.helpers import cli
from tests.cluster.digests import partition_contents, wait_converged
from tests.cluster.test_route_metrics import sample, scrape
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

OLD = {formats.APPLY_FORMAT_ENV: "0"}  # node n3 as a release that predates set_format
PERIOD_MS = 100  # housekeeping: the leader checks the members' formats this often


def views(c: DevCluster) -> list[NodeInfo | None]:
    return [c.node_status(i) for i in range(c.nodes)]


def formats_json(address: str) -> dict[str, object]:
    return dict(json.loads(cli(address, "--json", "cluster", "formats").stdout))


def first_within(predicate: Callable[[], bool], duration_s: float) -> bool:
    """Whether ``predicate`` holds at any poll during ``duration_s`` (for what must NOT happen)."""
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def publish(client: Client, start: int, n: int = 50) -> None:
    client.publish_batch("f", [{"value": b"%d" % i, "partition": i % 2} for i in range(start, start + n)])


def test_the_format_rises_after_the_last_member_is_upgraded_and_a_downgrade_past_it_is_refused(
        tmp_path: Path) -> None:
    c = DevCluster(3, tmp_path, env={**os.environ, "RAFTBROKER_HOUSEKEEPING_PERIOD_MS": str(PERIOD_MS)})
    c.env_by_node[2] = dict(OLD)
    with c:
        address = c.wait_ready(60)
        client = Client([address])
        try:
            client.create_topic("f", partitions=2)
            publish(client, 0)
            wait_until(lambda: [v and v.apply_format for v in views(c)] == [formats.CODE_FORMAT] * 2 + [0], 30,
                       "every node to report the format its code applies")
            # the leader checks every PERIOD_MS; for a hundred periods and more it must not raise the format
            rose = first_within(lambda: any(v is None or v.cluster_format for v in views(c)), 100 * PERIOD_MS / 1000)
            assert not rose, f"the format rose (or a node stopped answering) while n3 cannot apply it: {views(c)}"
            found = formats_json(address)
            assert found["cluster_format"] == 0 and found["members_apply"] == 0 and found["held_by"] == ["n3"], found
            assert "to raise it, upgrade n3" in cli(address, "cluster", "formats").stdout
            gauges = [(sample(scrape(c.metrics_address(i)), "raftbroker_command_format_applies"),
                       sample(scrape(c.metrics_address(i)), "raftbroker_command_format_cluster")) for i in range(3)]
            assert gauges == [(formats.CODE_FORMAT, 0)] * 2 + [(0, 0)], gauges

            # the upgrade of the last member: the leader raises the format, and every node applies it
            c.kill(2, signal.SIGTERM)
            c.env_by_node.pop(2)
            c.spawn(2)
            wait_until(lambda: [v and v.cluster_format for v in views(c)] == [formats.CODE_FORMAT] * 3, 60,
                       "the leader to raise the cluster's format once every member applies it")
            found = formats_json(address)
            assert found["cluster_format"] == formats.CODE_FORMAT and found["held_by"] == [], found
            assert [sample(scrape(c.metrics_address(i)), "raftbroker_command_format_cluster") for i in range(3)] == [
                formats.CODE_FORMAT] * 3
            publish(client, 50)

            # a downgrade of n3 past the cluster's format: it refuses to start and says why
            c.kill(2, signal.SIGTERM)
            c.env_by_node[2] = dict(OLD)
            c.spawn(2)
            proc = c.procs[2]
            assert proc is not None
            assert proc.wait(60) == 3, "refused: exit 3"
            said = c.log_path(2).read_text()
            assert "refusing to start" in said and "downgrade past the cluster's command format" in said, said[-2000:]
            publish(client, 100)  # the other two go on

            # back on the newer code, n3 catches up with nothing lost
            c.env_by_node.pop(2)
            c.spawn(2)
            wait_until(lambda: c.node_status(2) is not None, 60, "n3 to answer again")
            wait_converged(c)
            for p in (0, 1):
                held = [partition_contents(c.grpc_address(i), "f", p) for i in range(3)]
                assert held[0] == held[1] == held[2] and len(held[0]) == 75, p
        finally:
            client.close()
