"""Smoke of the peer benchmark: ``python -m bench --smoke`` (tiny counts, raftbroker disk-3 and Redis).

It proves the harness end to end (install check, start, every workload, stop, JSON/Markdown/PNG);
it asserts no speed. A missing peer fails the test with the reason (``make bench-deps`` installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ("publish_100", "queue", "latency", "failover", "recovery")


def _processes_under(root: Path) -> list[str]:
    """Command lines of live processes that mention ``root`` (servers the run left behind)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


@pytest.mark.cluster
def test_smoke_runs_every_workload_and_leaves_no_server_running(tmp_path: Path) -> None:
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    done = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--no-install", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"bench smoke failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-4000:]}"
    assert _processes_under(scratch) == []

    doc = json.loads((out / "smoke.json").read_text())
    assert doc["machine"]["cores"] == os.cpu_count()
    systems = {s["name"]: s for s in doc["systems"]}
    assert set(systems) == {"raftbroker-disk-3", "redis"}
    for name, system in systems.items():
        assert system["status"] == "ok", f"{name}: {system.get('reason')}"
        assert system["sync_before_s"] >= 0, "each system starts after the page cache is written back"
        assert system["data_removed_s"] >= 0, "each system's data is removed once it stops"
        for workload in WORKLOADS:
            entry = system["workloads"][workload]
            assert "error" not in entry, f"{name} {workload}: {entry['error']}"
            if entry.get("skipped"):
                assert name == "redis" and workload == "failover", f"{name} {workload} skipped: {entry['skipped']}"
                continue
            assert len(entry["reps"]) == 1 and entry["summary"], f"{name} {workload}: no result"
    assert systems["raftbroker-disk-3"]["workloads"]["publish_100"]["summary"]["published"]["median"] == 2000
    assert systems["raftbroker-disk-3"]["workloads"]["failover"]["summary"]["failover_s"]["median"] > 0
    for name, system in systems.items():  # the work queue drained every stored record, each acknowledged once
        queue = system["workloads"]["queue"]["summary"]
        assert queue["queue_acked"]["median"] == queue["queue_stored"]["median"] == 1000, name
        assert queue["queue_redelivered"]["median"] == 0, name

    table = (out / "smoke.md").read_text()
    assert "| raftbroker disk-3 | 3 |" in table and "| redis Streams AOF always | 1 |" in table
    assert "Ratios raftbroker / peer" in table
    assert (out / "smoke.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
