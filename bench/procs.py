"""Server processes the benchmark starts: free loopback ports, readiness waits, stop by PID.

Contract: every process is started in its own session (its PID is its process group id) and
registered in :data:`REGISTRY`; :meth:`ProcessRegistry.stop_all` (also run at interpreter exit
and on SIGTERM/SIGINT through :func:`install_cleanup`) stops each registered group by that PID:
SIGTERM, then SIGKILL after a grace period. Nothing is ever stopped by name.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

STOP_GRACE_S = 10.0
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on the loopback that is free right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
    return port


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class StartFailed(RuntimeError):
    """A server exited while the benchmark waited for it (the message carries its log's tail)."""


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.05,
               *, watch: Sequence[ManagedProcess] = ()) -> float:
    """Poll ``check`` until it is true; return the seconds it took. Raises ``TimeoutError`` after
    ``timeout_s``, and ``StartFailed`` as soon as a process in ``watch`` has exited."""
    started = time.monotonic()
    while True:
        for proc in watch:
            exited = proc.exited_early()
            if exited is not None:
                raise StartFailed(f"{what}: {exited}")
        try:
            if check():
                return time.monotonic() - started
        except StartFailed:
            raise
        except Exception:  # noqa: BLE001,S110 (not ready yet: connection refused, LOADING, ...)
            pass
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{what}: not ready within {timeout_s:g} s")
        time.sleep(interval_s)


class ManagedProcess:
    """One server process (its own process group), its log file, and how to stop it."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, user: str | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.user = user
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        assert not self.alive(), f"{self.name} is already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, cwd=self.cwd, user=self.user, start_new_session=True)
        REGISTRY.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exited_early(self) -> str | None:
        """A description of an unexpected exit (with the log's tail), or ``None`` while running."""
        if self.proc is None or self.proc.poll() is None:
            return None
        tail = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        return f"{self.name} (pid {self.proc.pid}) exited with {self.proc.returncode}; log tail:\n{tail}"

    def kill9(self) -> None:
        """SIGKILL the whole process group and reap it (the crash the failover workload needs)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; always reaps and unregisters."""
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace_s)
            # Children that outlive the leader of the group (e.g. an Erlang port program) go too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.poll() is None:
                proc.wait()
        REGISTRY.discard(self)


class Stoppable(Protocol):
    """Anything the registry can stop: a process, or a deployment of several."""

    def stop(self) -> None: ...


class ProcessRegistry:
    """Every process (or deployment) the benchmark started and has not stopped yet."""

    def __init__(self) -> None:
        self._items: list[Stoppable] = []

    def add(self, item: Stoppable) -> None:
        if item not in self._items:
            self._items.append(item)

    def discard(self, item: Stoppable) -> None:
        if item in self._items:
            self._items.remove(item)

    def __len__(self) -> int:
        return len(self._items)

    def stop_all(self) -> None:
        """Stop everything still registered, newest first; one failure does not stop the rest."""
        for item in reversed(list(self._items)):
            try:
                item.stop()
            finally:
                self.discard(item)


REGISTRY = ProcessRegistry()


def install_cleanup() -> None:
    """Stop every registered process at exit and on SIGTERM/SIGINT/SIGHUP (then exit 130/143)."""
    atexit.register(REGISTRY.stop_all)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        REGISTRY.stop_all()
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
