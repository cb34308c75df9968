"""Bounded evaluation of user CEL expressions in separate processes (issue 11 item 4).

CEL evaluation holds the GIL, so one costly expression evaluated in the broker process stops Raft
and the gRPC server with it. Here every evaluation runs in a small pool of evaluator processes
(:mod:`broker.leader.cel_worker`); the broker only waits on a socket (without the GIL). A call that
takes longer than its budget kills its process (a new one is started on demand) and raises
:class:`ExpressionBudgetExceeded`; so does one record that takes longer than
``record_budget_ms``, or an evaluator that dies (e.g. at its memory limit). Callers decide what a
breach means: a subscription ends with RESOURCE_EXHAUSTED, a route is paused with the error.
"""

from __future__ import annotations

import atexit
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Pipe
from typing import Any

from broker.core.errors import ResourceExhausted, Unavailable

log = logging.getLogger(__name__)

Row = tuple[bytes | None, dict[str, str], str, int, int, bytes]
Result = tuple[str, Any]


class ExpressionBudgetExceeded(ResourceExhausted):
    """An expression took longer than its evaluation budget (or exhausted its evaluator's memory)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Budgets of expression evaluation; a breach raises :class:`ExpressionBudgetExceeded`.

    A normal filter costs ~10 us per record. ``record_budget_ms`` is CPU time of the evaluator (a
    property of the expression, not of how busy the machine is: a wall-clock budget paused routes
    on a loaded machine); ``call_budget_ms`` is wall time and bounds how long one evaluation that
    never returns (a single record can run for minutes inside the CEL library) holds an evaluator
    and a CPU before its process is killed, with room for a machine that is busy.
    """

    record_budget_ms: int = 50
    call_budget_ms: int = 5000
    rows_per_call_max: int = 200
    workers_max: int = 2
    worker_memory_bytes_max: int = 1 << 30
    worker_start_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        assert 0 < self.record_budget_ms <= self.call_budget_ms <= 60_000
        assert 0 < self.rows_per_call_max <= 10_000
        assert 0 < self.workers_max <= 16
        assert self.worker_memory_bytes_max >= 64 << 20
        assert self.worker_start_timeout_ms > 0


class _Worker:
    """One evaluator process and the parent's end of its socket."""

    def __init__(self, memory_bytes: int, start_timeout_s: float) -> None:
        parent, child = Pipe(duplex=True)
        self.conn: Connection = parent
        self.process = subprocess.Popen(
            [sys.executable, "-m", "broker.leader.cel_worker", str(child.fileno()), str(memory_bytes)],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        child.close()
        if not self.conn.poll(start_timeout_s):
            self.kill()
            raise Unavailable("the CEL evaluator process did not start")
        self.conn.recv()  # ("ready",)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()


class CelSandbox:
    """A pool of evaluator processes, started on demand; thread-safe."""

    def __init__(self, limits: SandboxLimits = SandboxLimits()) -> None:
        self.limits = limits
        self._lock = threading.Condition()
        self._idle: list[_Worker] = []
        self._live = 0
        self._closed = False
        self.budget_breaches = 0  # how many calls were stopped for their budget (a gauge for operators)

    def evaluate(self, expression: str, rows: Sequence[Row]) -> list[Result]:
        """One ``(kind, payload)`` per row (see :mod:`broker.leader.cel_worker`), in order."""
        out: list[Result] = []
        step = self.limits.rows_per_call_max
        for start in range(0, len(rows), step):
            out.extend(self._call(expression, rows[start:start + step]))
        assert len(out) == len(rows)
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._lock.notify_all()
        for worker in idle:
            worker.kill()

    def _call(self, expression: str, rows: Sequence[Row]) -> list[Result]:
        worker = self._checkout()
        budget_s = self.limits.call_budget_ms / 1000
        try:
            worker.conn.send((expression, list(rows), self.limits.record_budget_ms / 1000))
            if not worker.conn.poll(budget_s):
                raise self._breach(f"evaluating {len(rows)} record(s) took longer than {self.limits.call_budget_ms} ms"
                                   " (wall time)")
            answer = worker.conn.recv()
        except (EOFError, OSError):
            self._discard(worker)
            raise self._breach("the evaluator process died (memory limit?)") from None
        except ExpressionBudgetExceeded:
            self._discard(worker)
            raise
        self._checkin(worker)
        if answer[0] == "slow":
            raise self._breach(f"one record took {answer[2] * 1000:.0f} ms of CPU, more than the "
                               f"{self.limits.record_budget_ms} ms budget per record")
        results: list[Result] = answer[1]
        return results

    def _breach(self, detail: str) -> ExpressionBudgetExceeded:
        with self._lock:
            self.budget_breaches += 1
        log.warning("CEL expression over budget: %s", detail)
        return ExpressionBudgetExceeded(f"expression over its evaluation budget: {detail}")

    def _checkout(self) -> _Worker:
        deadline = time.monotonic() + self.limits.worker_start_timeout_ms / 1000
        with self._lock:
            while not self._idle and self._live >= self.limits.workers_max:
                if self._closed or not self._lock.wait(max(0.0, deadline - time.monotonic())):
                    raise Unavailable("every CEL evaluator is busy")
            if self._idle:
                return self._idle.pop()
            self._live += 1
        try:
            return _Worker(self.limits.worker_memory_bytes_max, self.limits.worker_start_timeout_ms / 1000)
        except BaseException:
            with self._lock:
                self._live -= 1
                self._lock.notify()
            raise

    def _checkin(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                self._live -= 1
            else:
                self._idle.append(worker)
            self._lock.notify()
        if self._closed:
            worker.kill()

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._live -= 1
            self._lock.notify()


_shared: CelSandbox | None = None
_shared_lock = threading.Lock()


def shared() -> CelSandbox:
    """The process's sandbox (evaluator processes are per broker process, shared by every expression)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = CelSandbox()
            atexit.register(_shared.close)
        return _shared
