"""A node stops gracefully on SIGTERM whichever of its threads the kernel hands the signal to."""

from __future__ import annotations

import ctypes
import os
import signal

import pytest

from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

_TGKILL = {"x86_64": 234, "aarch64": 131}  # syscall numbers of tgkill(2)


def _signal_thread(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to one thread of process ``pid`` (what the kernel may do with a SIGTERM sent
    to the process: any thread that does not block it may take it)."""
    number = _TGKILL.get(os.uname().machine)
    if number is None:
        pytest.fail(f"no tgkill syscall number known for {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _signal_mask_blocks(pid: int, tid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        blocked = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
    return bool(blocked & (1 << (signum - 1)))


def test_a_sigterm_taken_by_another_thread_still_stops_the_node_gracefully(fresh_cluster: DevCluster) -> None:
    c = fresh_cluster
    c.wait_ready()
    i = 2
    pid = c.pids[i]
    assert pid is not None
    others = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid
                    and not _signal_mask_blocks(pid, int(t), signal.SIGTERM))
    assert others, "the node has threads besides the main one that take SIGTERM"
    _signal_thread(pid, others[len(others) // 2], signal.SIGTERM)
    wait_until(lambda: not c.alive(i), 20, "the node to exit after SIGTERM")
    proc = c.procs[i]
    assert proc is not None and proc.returncode == 0, f"exit code {proc.returncode if proc else None}"
    assert "stopping (SIGTERM)" in c.log_path(i).read_text(), "a graceful stop, not a kill"
