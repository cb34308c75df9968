"""``raftbroker_apply_failures_total`` has a series at 0 for every command kind before any failure,
so the RaftbrokerApplyFailed alert (``increase(...[10m]) > 0``) sees a node's first failure: a series
born at 1 has no earlier sample to rise from, and the alert never fired for it."""

from __future__ import annotations

import collections

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from broker.services.log_metrics import APPLY_FAILURE_KINDS, apply_failure_collector

pytestmark = pytest.mark.unit


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "raftbroker_apply_failures_total":
                out[sample.labels["command"]] = sample.value
    return out


def test_every_command_kind_is_exported_at_zero_before_it_fails_and_counts_after() -> None:
    failed: collections.Counter[str] = collections.Counter()
    registry = CollectorRegistry()
    registry.register(apply_failure_collector(lambda: failed))
    before = _samples(registry)
    assert before == dict.fromkeys(APPLY_FAILURE_KINDS, 0.0)
    assert {"append", "create_topic", "group_settle", "empty", "undecodable"} <= set(before)
    failed["append"] += 1
    after = _samples(registry)
    assert after["append"] == 1.0 and set(after) == set(before)
    assert b'raftbroker_apply_failures_total{command="append"} 1.0' in generate_latest(registry)
