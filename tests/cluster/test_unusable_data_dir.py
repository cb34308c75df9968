"""``raftbroker serve`` with a data directory it cannot create or write stops with one line naming the
directory and exit code 2, before Raft or any port starts (it was a Python traceback and exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.devcluster import METRICS_PORT_OFFSET, RAFT_PORT_OFFSET, free_base_port

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _through_a_file(tmp_path: Path) -> Path:
    (tmp_path / "a-file").write_text("not a directory")
    return tmp_path / "a-file" / "data"


def _read_only_mount(tmp_path: Path) -> Path:
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip()}")
    return mount


@pytest.mark.parametrize("make", [_through_a_file, _read_only_mount])
def test_an_unusable_data_directory_stops_serve_with_one_line_and_exit_code_2(
        tmp_path: Path, make: Callable[[Path], Path]) -> None:
    if make is _read_only_mount and os.geteuid() != 0:
        pytest.skip("mounting needs root")
    data_dir = make(tmp_path)
    base = free_base_port(1)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "broker.cli.launch", "serve", "--node-id", "n1", "--data-dir", str(data_dir),
             "--grpc", f"127.0.0.1:{base}", "--raft", f"127.0.0.1:{base + RAFT_PORT_OFFSET}",
             "--metrics", f"127.0.0.1:{base + METRICS_PORT_OFFSET}"],
            capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, check=False)
    finally:
        if make is _read_only_mount:
            subprocess.run(["umount", str(data_dir)], check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith(f"error: data directory {data_dir}: "), done.stderr
    assert "ready" not in done.stdout
