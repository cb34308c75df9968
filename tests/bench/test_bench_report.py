"""The pure parts of the benchmark: summaries, ratios, the Markdown table, the profile parser."""

from __future__ import annotations

from typing import Any

import pytest

from bench import profile, report
from bench.config import SMOKE
from bench.stats import Summary, ratio, summarize, summarize_reps

pytestmark = pytest.mark.unit


def test_summaries_are_median_min_max_of_the_repetitions() -> None:
    assert summarize([3.0, 1.0, 2.0]) == Summary(2.0, 1.0, 3.0, 3)
    reps = summarize_reps([{"a": 1.0, "b": 5.0}, {"a": 3.0}])
    assert reps["a"] == Summary(2.0, 1.0, 3.0, 2) and reps["b"] == Summary(5.0, 5.0, 5.0, 1)


def test_ratio_is_none_without_both_figures() -> None:
    assert ratio(10.0, 4.0) == 2.5
    assert ratio(None, 4.0) is None and ratio(1.0, 0.0) is None


def _system(name: str, key: str, publish: float, skipped: str | None = None) -> dict[str, Any]:
    summary = {"publish_msgs_per_s": {"median": publish, "min": publish * 0.9, "max": publish * 1.1, "n": 3},
               "published": {"median": 2000.0, "min": 1500.0, "max": 2000.0, "n": 3}}
    failover: dict[str, Any] = {"reps": [], "summary": {}, "skipped": skipped} if skipped else {
        "reps": [{"failover_s": 0.5}], "summary": {"failover_s": {"median": 0.5, "min": 0.5, "max": 0.5, "n": 1}}}
    return {"name": name, "status": "ok",
            "info": {"key": key, "nodes": 3, "version": "1", "guarantee": "g", "client": "c", "notes": []},
            "workloads": {"publish_100": {"reps": [], "summary": summary}, "failover": failover}}


def test_markdown_has_the_table_ratios_caps_and_unavailable_variants() -> None:
    doc = {"date": "2026-11-22T00:00:00+00:00", "duration_s": 1.0,
           "machine": {"cores": 2, "cpu": "x", "memory_gib": 1.0, "python": "3.11", "load_avg_at_start": [0.0]},
           "config": SMOKE.to_json(),
           "systems": [_system("raftbroker-disk-3", "raftbroker disk-3", 50_000.0),
                       {"name": "raftbroker-fsync-3", "status": "not available", "reason": "not available yet"},
                       _system("redis", "redis Streams", 25_000.0, skipped="single node")]}
    text = report.markdown(doc, chart="c.png")
    assert "| raftbroker disk-3 | 3 | 50.0k (45.0k–55.0k) |" in text
    assert "| raftbroker-fsync-3 | ? | not available: not available yet |" in text
    assert "n/a (single node)" in text
    assert "| raftbroker disk-3 | redis Streams | 2.00× |" in text
    assert "1,500–2,000 of 2,000 records" in text
    assert "![throughput, latency, failover and restart per system](c.png)" in text


def _queue(rate: float, acked: float, stored: float, again: float = 0.0) -> dict[str, Any]:
    def one(v: float) -> dict[str, float]:
        return {"median": v, "min": v, "max": v, "n": 1}

    return {"reps": [], "summary": {"queue_msgs_per_s": one(rate), "queue_msgs_per_cpu_s": one(rate / 2),
                                    "queue_acked": one(acked), "queue_stored": one(stored),
                                    "queue_redelivered": one(again)}}


def test_the_work_queue_column_its_caps_and_documents_from_before_it() -> None:
    config = SMOKE.to_json()
    ours = _system("raftbroker-disk-3", "raftbroker disk-3", 50_000.0)
    ours["workloads"]["queue"] = _queue(7_000.0, 1_000.0, 1_000.0)
    peer = _system("rabbitmq-quorum", "rabbitmq quorum queue", 25_000.0)
    peer["workloads"]["queue"] = _queue(2_500.0, 800.0, 1_000.0, again=3.0)
    log = _system("rabbitmq-stream", "rabbitmq stream", 25_000.0)
    log["workloads"]["queue"] = {"reps": [], "summary": {}, "skipped": "no per-message acks"}
    doc = {"date": "2026-12-06T00:00:00+00:00", "duration_s": 1.0,
           "machine": {"cores": 2, "cpu": "x", "memory_gib": 1.0, "python": "3.11", "load_avg_at_start": [0.0]},
           "config": config, "systems": [ours, peer, log]}
    text = report.markdown(doc)
    heading = f"work queue 100 B msg/s ({config['queue_concurrency']} in flight, an ack each)"
    assert heading in text and "work queue 100 B msgs per CPU-s (servers+client)" in text
    row = next(line for line in text.splitlines() if line.startswith("| raftbroker disk-3 | 3 |"))
    assert "| 7.0k | 3.5k |" in row
    assert "n/a (no per-message acks)" in text
    assert "rabbitmq quorum queue, work queue: 800–800 of 1,000 stored records acknowledged before" in text
    assert "up to 3 records acknowledged twice" in text
    ratio_row = next(line for line in text.splitlines()
                     if line.startswith("| raftbroker disk-3 | rabbitmq quorum queue |"))
    assert "| 2.80× | 2.80× |" in ratio_row
    # A document written before the workload existed renders without its columns.
    old_config = {k: v for k, v in config.items() if not k.startswith("queue_")}
    old = report.markdown(dict(doc, config=old_config, systems=[_system("redis", "redis", 1.0)]))
    assert "work queue" not in old


def test_hot_spots_count_self_and_inclusive_time_per_function() -> None:
    folded = ("run (/x/site-packages/grpc/_server.py:10);handle (broker/services/broker.py:5);"
              "encode (broker/core/codec.py:7) 30\n"
              "run (/x/site-packages/grpc/_server.py:10);handle (broker/services/broker.py:6) 10\n")
    samples, spots = profile.hot_spots(folded)
    assert samples == 40
    assert spots[0].function == "encode (core/codec.py)" and spots[0].self_pct == 75.0
    handle = next(s for s in profile.top_inclusive(folded) if s.function.startswith("handle"))
    assert handle.total_pct == 100.0 and handle.self_pct == 25.0
