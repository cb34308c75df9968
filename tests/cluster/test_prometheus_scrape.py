"""A real Prometheus server (Debian's) scrapes a 3-node dev cluster with deploy/alerts.yaml loaded:
every target is up, every rule evaluates without error, every dashboard query runs, and losing the
quorum fires RaftbrokerNoQuorum.

The rules are the shipped ones, except that RaftbrokerNoQuorum's ``for`` (1 minute) is cut to
``NO_QUORUM_FOR``, so the test does not sit out a minute. The expression is the shipped one.
promtool's unit tests (``deploy/alerts.test.yaml``, ``make alerts``) check the shipped ``for``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from broker.client import Client, Message
from broker.devcluster import DevCluster
from tests.conftest import start_cluster, wait_until
from tests.metrics_catalog import ALERTS, DASHBOARD

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(400)]

JOB = "raftbroker"
NO_QUORUM_FOR = "5s"
# panels that must show data for a cluster with topics, publishes and a consumer group
MUST_HAVE_DATA = {"Leader", "Quorum", "Term", "Follower lag (entries)", "Requests by method", "Published records",
                  "Delivered records", "Lag (records)", "Dead letters", "Store size", "Free disk (data directory)",
                  "CPU", "Resident memory"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A Prometheus server on loopback scraping ``targets`` every second, with the alert rules."""

    def __init__(self, tmp: Path, targets: list[str]) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus not found: install Debian's prometheus package (make metrics-deps does it)"
        self.address = f"127.0.0.1:{_free_port()}"
        rules = yaml.safe_load(ALERTS.read_text())
        no_quorum = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "RaftbrokerNoQuorum"]
        assert len(no_quorum) == 1 and no_quorum[0]["for"] == "1m", no_quorum
        no_quorum[0]["for"] = NO_QUORUM_FOR
        (tmp / "alerts.yaml").write_text(json.dumps(rules))  # JSON is YAML
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / "alerts.yaml")],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": targets}]}],
        }))
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                 f"--web.listen-address={self.address}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def api(self, path: str, **params: str) -> Any:
        url = f"http://{self.address}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[Any]:
        result: list[Any] = self.api("query", query=expr)["result"]
        return result

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[DevCluster, Prometheus]]:
    cluster = start_cluster(tmp_path / "cluster")
    prometheus: Prometheus | None = None
    try:
        with Client(cluster.addresses, retry_deadline_s=30) as client:
            client.create_topic("orders", partitions=2)
            for i in range(20):
                client.publish("orders", f"order-{i}")
            assert sum(1 for _ in client.subscribe("orders", stop_at_end=True)) == 20
            consumer = client.subscribe("orders", group="billing")
            for item in consumer:
                if isinstance(item, Message):
                    item.discard("unpayable")
                    break
            consumer.close()
        (tmp_path / "prometheus").mkdir()
        prometheus = Prometheus(tmp_path / "prometheus", [cluster.metrics_address(i) for i in range(cluster.nodes)])
        wait_until(prometheus.ready, 60, "Prometheus to be ready")
        yield cluster, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        cluster.stop()


def _dashboard_queries() -> dict[str, list[str]]:
    """Panel title -> its expressions, with Grafana's variables given values."""
    out: dict[str, list[str]] = {}
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "10s").replace('"$job"', f'"{JOB}"')
            out.setdefault(panel["title"], []).append(re.sub(r'"\$\w+"', '".*"', expr))
    return out


def test_prometheus_scrapes_the_cluster_evaluates_the_rules_and_alerts_on_a_lost_quorum(
        scraped: tuple[DevCluster, Prometheus]) -> None:
    cluster, prometheus = scraped

    def all_up() -> bool:
        targets = prometheus.api("targets")["activeTargets"]
        return len(targets) == cluster.nodes and all(t["health"] == "up" for t in targets)

    wait_until(all_up, 60, "every node's endpoint to be scraped")

    def rules_evaluated() -> bool:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        assert all(r["health"] != "err" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
        return len(rules) >= 8 and all(r["health"] == "ok" for r in rules)

    wait_until(rules_evaluated, 60, "every alert rule to be evaluated")
    assert prometheus.query(f'max by (job) (raftbroker_raft_has_quorum{{job="{JOB}"}})')[0]["value"][1] == "1"
    # pending at most until the first scrapes (absent() before them), never firing on a healthy cluster
    wait_until(lambda: prometheus.query('ALERTS{alertname="RaftbrokerNoQuorum"}') == [], 30,
               "no RaftbrokerNoQuorum alert, not even pending")

    queries = _dashboard_queries()

    def panels_with_data() -> set[str]:
        return {title for title, exprs in queries.items() if any(prometheus.query(e) for e in exprs)}

    # rates need two scrapes in their window; every query runs (an error fails in api())
    wait_until(lambda: panels_with_data() >= MUST_HAVE_DATA, 60,
               f"data in the panels {sorted(MUST_HAVE_DATA)}")

    leader = wait_until(lambda: cluster.leader() is not None, 30, "a leader") and cluster.leader()
    assert leader is not None
    for i in range(cluster.nodes):
        if i != leader:
            cluster.kill(i)

    def no_quorum_fires() -> bool:
        return any(a["labels"]["alertname"] == "RaftbrokerNoQuorum" and a["state"] == "firing"
                   for a in prometheus.api("alerts")["alerts"])

    wait_until(no_quorum_fires, 120, f"RaftbrokerNoQuorum to fire (it waits {NO_QUORUM_FOR})", interval_s=1.0)
