"""``raftbroker serve`` with a TLS, tokens or ACL file it cannot use stops with one line naming the
file and exit code 2, as for any bad setting (it was a Python traceback and exit code 1)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.devcluster import METRICS_PORT_OFFSET, RAFT_PORT_OFFSET, free_base_port
from broker.security.devcerts import DevSecurity

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _broken_acl(sec: DevSecurity) -> Path:
    sec.acl_file.write_text("garbage [\n")
    return sec.acl_file


def _bad_tokens(sec: DevSecurity) -> Path:  # a missing file is refused with the settings already
    sec.tokens_file.write_text('[[token]]\nprincipal = "x"\nsha256 = "not-a-digest"\n')
    return sec.tokens_file


def _someone_elses_key(sec: DevSecurity) -> Path:
    sec.node_args("n2")
    key = sec.node_cert("n1")[1]
    shutil.copy(sec.node_cert("n2")[1], key)
    return key


@pytest.mark.parametrize("break_it", [_broken_acl, _bad_tokens, _someone_elses_key])
def test_an_unusable_security_file_stops_serve_with_one_line_and_exit_code_2(
        tmp_path: Path, break_it: Callable[[DevSecurity], Path]) -> None:
    base = free_base_port(1)
    grpc = f"127.0.0.1:{base}"
    sec = DevSecurity(tmp_path / "sec").ensure([grpc])
    args = sec.node_args("n1")
    named = break_it(sec)
    done = subprocess.run(
        [sys.executable, "-m", "broker.cli.launch", "serve", "--node-id", "n1", "--data-dir", str(tmp_path / "d"),
         "--grpc", grpc, "--raft", f"127.0.0.1:{base + RAFT_PORT_OFFSET}",
         "--metrics", f"127.0.0.1:{base + METRICS_PORT_OFFSET}", *args],
        capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    last = done.stderr.rstrip().splitlines()[-1]
    assert last.startswith("error: security settings: ") and str(named) in last, done.stderr
    assert "ready" not in done.stdout
