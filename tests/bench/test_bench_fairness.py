"""The fairness parts of the benchmark: distinct seeded payloads, CPU accounting from /proc, the
like-for-like exactly-once marking and the transport-cost micro-benchmark's entries."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from bench import __main__ as bench_main
from bench import cpu, report, transport_cost
from bench.config import SMOKE, BenchConfig
from bench.runner import Factories
from bench.systems.raftbroker import RaftbrokerDeployment
from bench.workloads import Payloads

pytestmark = pytest.mark.unit


def test_payloads_are_distinct_seeded_and_do_not_compress() -> None:
    a, b = Payloads(100, 7), Payloads(100, 7)
    batch = a.batch(0, 1000)
    assert batch == b.batch(0, 1000), "the same seed gives the same payloads"
    assert Payloads(100, 8).batch(0, 10) != batch[:10]
    assert len(set(batch)) == 1000 and all(len(p) == 100 for p in batch)
    assert len(set(a.batch(0, 20_000))) == 20_000
    joined = b"".join(batch)
    assert len(zlib.compress(joined, 3)) > 0.95 * len(joined)
    assert len(Payloads(1, 7).get(5)) == 8, "room for the latency workload's timestamp"


def test_config_rejects_empty_runs() -> None:
    with pytest.raises(ValueError, match="publish_records"):
        BenchConfig(publish_records=0)
    assert BenchConfig().publish_records >= 1_000_000 and BenchConfig().publish_cap_s >= 10


def test_each_system_s_data_is_removed_before_the_next_system_starts(tmp_path: Path) -> None:
    """A stopped system's files (and the page cache they hold) must not tax the next system's writes."""
    factories = Factories(BenchConfig(), tmp_path)
    first = factories.build("raftbroker-disk-3")
    assert isinstance(first, RaftbrokerDeployment)
    (first.workdir / "cluster").mkdir(parents=True)
    (first.workdir / "cluster" / "segment").write_bytes(b"x" * 4096)
    assert factories.release() >= 0
    assert list(tmp_path.iterdir()) == [], "the first system's data outlived it"
    second = factories.build("raftbroker-fsync-3")
    assert isinstance(second, RaftbrokerDeployment) and second.workdir.is_dir()
    factories.release()
    assert list(tmp_path.iterdir()) == []


def test_sizes_option_chooses_the_record_sizes_and_refuses_bad_ones() -> None:
    def config(sizes: str) -> BenchConfig:
        return bench_main._config(argparse.Namespace(smoke=False, systems=None, workloads=None, reps=None,
                                                     records=None, sizes=sizes))

    assert config("1024,100").record_sizes == (1024, 100)
    for bad in ("1k", "1024,,100", "4"):
        with pytest.raises(SystemExit, match="--sizes"):
            config(bad)


def test_group_cpu_counts_a_busy_process_group() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.process_time()\n"
                             "while time.process_time() - t < 0.6: pass\ntime.sleep(60)"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        used = 0.0
        while time.monotonic() < deadline:
            used = cpu.group_cpu_s([busy.pid])
            if used >= 0.5:
                break
            time.sleep(0.05)
        assert used >= 0.5, f"saw {used} CPU seconds"
        assert cpu.group_cpu_s([]) == 0.0
    finally:
        os.killpg(busy.pid, signal.SIGKILL)
        busy.wait()
    before = cpu.CpuSample.take([])
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    assert cpu.CpuSample.take([]).since(before).client_s >= 0.15


def _system(name: str, key: str, exactly_once: str) -> dict[str, Any]:
    summary = {"publish_msgs_per_s": {"median": 1000.0, "min": 1000.0, "max": 1000.0, "n": 1},
               "publish_msgs_per_cpu_s": {"median": 500.0, "min": 500.0, "max": 500.0, "n": 1}}
    return {"name": name, "status": "ok",
            "info": {"key": key, "nodes": 3, "version": "1", "guarantee": "g", "client": "c", "notes": [],
                     "publish_api": f"api of {key}", "exactly_once": exactly_once},
            "workloads": {"publish_100": {"reps": [], "summary": summary}}}


def test_table_states_api_exactly_once_cpu_and_the_like_for_like_pair() -> None:
    doc = {"date": "2026-11-24T00:00:00+00:00", "duration_s": 1.0,
           "machine": {"cores": 2, "cpu": "x", "memory_gib": 1.0, "python": "3.11", "load_avg_at_start": [0.0]},
           "config": SMOKE.to_json(),
           "systems": [_system("raftbroker-disk-3", "raftbroker disk-3", "key per record"),
                       _system("nats", "nats plain", ""), _system("nats-dedup", "nats dedup", "Nats-Msg-Id")]}
    text = report.markdown(doc)
    assert "publish 100 B msgs per CPU-s (servers+client)" in text
    assert "| yes | api of raftbroker disk-3 |" in text and "| no | api of nats plain |" in text
    assert "| raftbroker disk-3 | nats dedup (like-for-like exactly-once) | 1.00× | 1.00× |" in text
    assert "| raftbroker disk-3 | nats plain | 1.00×" in text
    assert "Like-for-like exactly-once pairs" in text and "raftbroker disk-3 vs nats dedup" in text


def test_transport_entries_carry_distinct_records_and_zlib_costs_cpu() -> None:
    costs = transport_cost.measure(50, 100, entries=2, rounds=1)
    assert set(costs) == {"none", "zlib"}
    assert 0.99 < costs["none"].wire_ratio < 1.05, "protocol 5 sends the entry's bytes as they are"
    assert costs["zlib"].wire_ratio > 0.5, "distinct random payloads do not compress much"
    assert all(c.encode_s_per_mb > 0 for c in costs.values())
