"""The metric families documented in docs/metrics.md, the PromQL of the dashboard and the alerts,
and promtool: shared by the unit tests (files agree) and the cluster tests (a real node agrees)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "metrics.md"
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"
ALERTS = ROOT / "deploy" / "alerts.yaml"

_ROW = re.compile(r"^\| `(?P<name>[a-z_:][a-z0-9_:]*)` \| (?P<type>counter|gauge|histogram|info) \|")
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "info": ("",),
             "histogram": ("_bucket", "_sum", "_count")}
# PromQL words that look like metric names
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                 "offset", "le", "inf", "nan"}


def documented_families() -> dict[str, str]:
    """Family name (as on its ``# TYPE`` line) -> type, from the tables of docs/metrics.md."""
    out: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        m = _ROW.match(line)
        if m:
            name, kind = m["name"], m["type"]
            if kind == "counter":
                assert name.endswith("_total"), f"docs/metrics.md: counter {name} must be written with _total"
                name = name.removesuffix("_total")
            out[name] = "gauge" if kind == "info" else kind
    return out


def documented_series_names() -> set[str]:
    """Every sample name a query may use: counters end in _total, histograms in _bucket/_sum/_count."""
    return {family + suffix for family, kind in documented_families().items() for suffix in _SUFFIXES[kind]}


# Series Prometheus itself writes for every target it scrapes (no node exports them): an alert may
# use them, e.g. RaftbrokerNodeDown on `up`.
SCRAPE_SERIES = frozenset({"up"})


def dashboard_expressions() -> Iterator[str]:
    """The ``expr`` of every panel target and the query of every query variable."""
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            yield variable["query"]["query"]


def alert_expressions() -> Iterator[tuple[str, str]]:
    """(alert name, expression) of every rule in deploy/alerts.yaml."""
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule.get("record"), rule["expr"]


def metric_names(expr: str) -> set[str]:
    """Metric names used in a PromQL expression (label matchers, strings, functions and keywords
    removed); template variables like ``$topic`` are dropped first."""
    expr = re.sub(r"label_values\(([^,]+),\s*\w+\)", r"\1", expr)  # Grafana: label_values(selector, label)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    names = set()
    for m in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = m.group(0)
        rest = text[m.end():].lstrip()
        if rest.startswith("("):  # a function or aggregation
            continue
        if word.lower() in _PROMQL_WORDS:
            continue
        names.add(word)
    return names


def promtool() -> str:
    """Path of promtool (Debian's prometheus package); fails plainly when it is missing."""
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's prometheus package (make alerts does it)"
    return path
