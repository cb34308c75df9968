"""``raftbroker bench failover`` (broker/cli/failover_bench.py) against the temporary cluster it starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import processes_naming

REPO = Path(__file__).resolve().parents[2]
# the unwinding stops the cluster (at most 10 s per node, devcluster.STOP_TIMEOUT_S) after the client's
# calls in flight end; generous for a loaded machine
UNWIND_S_MAX = 150.0


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_sigterm_stops_the_benchmarks_nodes_removes_their_data_and_exits_143(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"  # the benchmark's cluster lives in a temporary directory: under this one
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "broker.cli.main", "bench", "failover", "--trials", "100"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(processes_naming(tmp)) < 3:
            time.sleep(0.2)
        assert len(processes_naming(tmp)) >= 3, "the benchmark started its nodes"
        time.sleep(2.0)  # into the trials
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=UNWIND_S_MAX)
        except subprocess.TimeoutExpired:  # say where it waits before failing (a CI run once took > 60 s)
            stack = subprocess.run([str(Path(sys.executable).parent / "py-spy"), "dump", "--pid", str(proc.pid)],
                                   capture_output=True, text=True, timeout=60, check=False)
            pytest.fail(f"no exit {UNWIND_S_MAX:g} s after SIGTERM; its threads:\n{stack.stdout}{stack.stderr}")
        assert proc.returncode == 128 + signal.SIGTERM, out
    finally:
        if proc.poll() is None:
            proc.kill()
        left = processes_naming(tmp)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == [], "nodes left running"
    assert list(tmp.iterdir()) == [], "the cluster's temporary data was left behind"
