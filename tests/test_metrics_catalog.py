"""The dashboard and the alerts use only the families docs/metrics.md lists (which the cluster test
tests/cluster/test_operator_metrics.py checks against a real node), and their PromQL parses."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.metrics_catalog import (
    ALERTS,
    DASHBOARD,
    SCRAPE_SERIES,
    alert_expressions,
    dashboard_expressions,
    documented_families,
    documented_series_names,
    metric_names,
    promtool,
)

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def test_metric_names_finds_the_series_of_an_expression_and_nothing_else() -> None:
    expr = ('histogram_quantile(0.99, sum by (grpc_method, le) (rate(raftbroker_grpc_server_handling_seconds_bucket'
            '{job=~"$job",grpc_type="unary"}[$__rate_interval]))) / on (job) group_left up offset 5m')
    assert metric_names(expr) == {"raftbroker_grpc_server_handling_seconds_bucket", "up"}
    assert metric_names('label_values(raftbroker_raft_role{job=~"$job"}, instance)') == {"raftbroker_raft_role"}


def test_the_docs_list_each_family_once() -> None:
    doc = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
    names = re.findall(r"^\| `([a-z_:][a-z0-9_:]*)` \| (?:counter|gauge|histogram|info) \|", doc.read_text(), re.M)
    assert len(names) == len(set(names)) == len(documented_families()) > 40


def test_every_dashboard_expression_uses_exported_families_only() -> None:
    known = documented_series_names()
    expressions = list(dashboard_expressions())
    assert len(expressions) > 40
    unknown = {expr: sorted(metric_names(expr) - known) for expr in expressions if metric_names(expr) - known}
    assert unknown == {}
    assert all(metric_names(expr) for expr in expressions), "an expression without a metric"


def test_the_dashboard_is_importable_json_with_unique_panel_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "job", "instance", "topic", "group"}
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_alert_uses_exported_families_only_and_has_a_unit_test() -> None:
    known = documented_series_names() | SCRAPE_SERIES
    alerts = dict(alert_expressions())
    assert set(alerts) >= {"RaftbrokerNoQuorum", "RaftbrokerNodeDown", "RaftbrokerLeaderFlapping",
                           "RaftbrokerFollowerLagging", "RaftbrokerRouteStuck", "RaftbrokerGroupLagGrowing",
                           "RaftbrokerDeadLettersGrowing", "RaftbrokerDiskAlmostFull"}
    unknown = {name: sorted(metric_names(expr) - known) for name, expr in alerts.items() if metric_names(expr) - known}
    assert unknown == {}
    tests = yaml.safe_load((ALERTS.parent / "alerts.test.yaml").read_text())["tests"]
    tested = {case["alertname"] for test in tests for case in test.get("alert_rule_test", [])
              if case.get("exp_alerts")}
    assert set(alerts) - tested == set(), "alerts without a unit test that makes them fire"


def test_the_dashboards_promql_parses(tmp_path: Path) -> None:
    """Each expression (Grafana variables replaced by values) as a recording rule: promtool parses it."""
    rules = [{"record": f"dashboard:expr_{i}", "expr": re.sub(r"\$__\w+", "5m", re.sub(r'"\$\w+"', '".*"', expr))}
             for i, expr in enumerate(dashboard_expressions()) if not expr.startswith("label_values(")]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_docs_alert_table_lists_every_alert_with_its_for_and_severity() -> None:
    """docs/metrics.md's alert table against deploy/alerts.yaml: the same alerts, each with its
    ``for`` (0 when none) and severity (two were missing from the table once)."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "metrics.md").read_text()
    table = doc.split("## Alerts", 1)[1].split("\n## ", 1)[0]
    rows = {cells[0].strip("` "): (cells[-2].strip(), cells[-1].strip())
            for line in table.splitlines() if line.startswith("| `")
            for cells in [line.strip("|").split(" | ")]}
    rules = {rule["alert"]: (str(rule.get("for", "0")), rule["labels"]["severity"])
             for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"] if "alert" in rule}
    assert rows == rules
