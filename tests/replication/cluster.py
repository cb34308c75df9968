"""Test harness: raft nodes as separate processes (``node_worker.py``), polled with deadlines.

Every process is killed by PID in :meth:`Cluster.kill_all` (the ``cluster`` fixture calls it).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.devcluster import free_base_port

from .chain_sm import LOG_NAME, Record, read_records

WORKER = Path(__file__).with_name("node_worker.py")
REPO_ROOT = Path(__file__).resolve().parents[2]

# Test-friendly timeouts (same relations as the defaults): elections settle fast on loopback.
TEST_OPTIONS: dict[str, Any] = {
    "raft_min_timeout_s": 0.4,
    "raft_max_timeout_s": 0.8,
    "connection_retry_s": 0.3,
}


_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=512)  # not handed out again soon


def free_port() -> int:
    """A port that is free right now, below the kernel's ephemeral range, as the dev cluster picks
    its ports (``devcluster.free_base_port``). A port bound to 0 and released lies inside that range,
    where any process's outgoing connection can take it before the node binds it: a node that
    cannot bind its Raft port never joins, and no leader is agreed on (a CI run timed out so)."""
    while True:
        port = free_base_port(1)
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.1f} s waiting for {what}")
        time.sleep(interval_s)


class NodeProcess:
    """One worker process; ``request`` sends a JSON op and waits for the reply with its id."""

    _ids = itertools.count(1)

    def __init__(self, address: str, peers: list[str], directory: Path, log_path: Path,
                 options: dict[str, Any], patches_off: tuple[str, ...], instrument: bool) -> None:
        self.address = address
        self.peers = peers
        self.directory = directory
        self.log_path = log_path
        self.options = options
        self.patches_off = patches_off
        self.instrument = instrument
        self.apply_delay_ms = 0.0  # the next start's state machine sleeps this long in each apply
        self.proc: subprocess.Popen[str] | None = None
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), RAFTBROKER_PYSYNCOBJ_PATCHES_OFF=",".join(self.patches_off))
        cmd = [sys.executable, str(WORKER), "--self", self.address, "--peers", ",".join(self.peers),
               "--dir", str(self.directory), "--options", json.dumps(self.options)]
        if self.instrument:
            cmd.append("--instrument")
        if self.apply_delay_ms:
            cmd += ["--apply-delay-ms", str(self.apply_delay_ms)]
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         text=True, bufsize=1, env=env)
        self._replies = {}
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        with self._cond:
            ready = self._cond.wait_for(lambda: 0 in self._replies or self.proc.poll() is not None, 15)  # type: ignore[union-attr]
        assert ready and 0 in self._replies, f"{self.address} did not start; see {self.log_path}"

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            with self._cond:
                self._replies[message.get("id", 0)] = message
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, op: str, **fields: Any) -> int:
        assert self.proc is not None and self.proc.stdin is not None
        request_id = next(self._ids)
        self.proc.stdin.write(json.dumps({"op": op, "id": request_id, **fields}) + "\n")
        self.proc.stdin.flush()
        return request_id

    def wait_reply(self, request_id: int, timeout_s: float) -> dict[str, Any] | None:
        """The reply, or None when none arrived within ``timeout_s``."""
        with self._cond:
            self._cond.wait_for(lambda: request_id in self._replies or not self.alive, timeout_s)
            return self._replies.pop(request_id, None)

    def request(self, op: str, timeout_s: float = 10.0, **fields: Any) -> dict[str, Any]:
        reply = self.wait_reply(self.send(op, **fields), timeout_s)
        assert reply is not None, f"no reply to {op} from {self.address} within {timeout_s} s"
        return reply

    def status(self) -> dict[str, Any] | None:
        return self.request("status") if self.alive else None

    def records(self) -> list[Record]:
        return read_records(self.directory / "sm" / LOG_NAME)

    def kill(self) -> None:
        """SIGKILL by PID and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


class Cluster:
    """A group of node processes on loopback with fresh ports."""

    def __init__(self, root: Path, size: int = 3, options: dict[str, Any] | None = None,
                 patches_off: tuple[str, ...] = (), instrument: bool = False) -> None:
        addresses = [f"127.0.0.1:{free_port()}" for _ in range(size)]
        (root / "logs").mkdir(parents=True, exist_ok=True)
        self.nodes = [
            NodeProcess(address, addresses, root / f"node{i}", root / "logs" / f"node{i}.log",
                        {**TEST_OPTIONS, **(options or {})}, patches_off, instrument)
            for i, address in enumerate(addresses)
        ]

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def kill_all(self) -> None:
        for node in self.nodes:
            node.kill()

    def statuses(self) -> dict[str, dict[str, Any]]:
        return {n.address: st for n in self.nodes if (st := n.status()) is not None}

    def node(self, address: str) -> NodeProcess:
        return next(n for n in self.nodes if n.address == address)

    def leader(self, timeout_s: float = 10.0) -> NodeProcess:
        """The single live node that reports itself leader, with every live node agreeing."""
        def find() -> NodeProcess | None:
            sts = self.statuses()
            leaders = [a for a, st in sts.items() if st["role"] == "leader"]
            if len(leaders) == 1 and all(st["leader"] == leaders[0] for st in sts.values()):
                return self.node(leaders[0])
            return None
        return wait_until(find, timeout_s, "a leader all live nodes agree on")

    def wait_applied(self, index: int, timeout_s: float, nodes: list[NodeProcess] | None = None) -> None:
        targets = nodes or [n for n in self.nodes if n.alive]
        wait_until(lambda: all((st := n.status()) and st["applied_index"] >= index for n in targets),
                   timeout_s, f"applied index {index} on {[n.address for n in targets]}")
