"""Bounded evaluation of user CEL expressions in separate processes (issue 11 item 4).

CEL evaluation holds the GIL, so one costly expression evaluated in the broker process stops Raft
and the gRPC server with it. Here every evaluation runs in a small pool of evaluator processes
(:mod:`broker.leader.cel_worker`, pooled by :mod:`broker.leader.worker_pool`); the broker only
waits on a socket (without the GIL). A call that takes longer than its budget kills its process (a
new one is started on demand) and raises :class:`ExpressionBudgetExceeded`; so does one record that
takes longer than ``record_budget_ms``, or an evaluator that dies (e.g. at its memory limit). Callers decide what a
breach means: a subscription ends with RESOURCE_EXHAUSTED, a route is paused with the error.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.core.errors import ResourceExhausted
from broker.leader.worker_pool import WorkerPool

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


class CelSandbox:
    """A pool of evaluator processes, started on demand; thread-safe."""

    def __init__(self, limits: SandboxLimits = SandboxLimits()) -> None:
        self.limits = limits
        self._pool = WorkerPool("broker.leader.cel_worker", workers_max=limits.workers_max,
                                memory_bytes=limits.worker_memory_bytes_max,
                                start_timeout_s=limits.worker_start_timeout_ms / 1000)
        self._lock = threading.Lock()
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
        self._pool.close()

    def _call(self, expression: str, rows: Sequence[Row]) -> list[Result]:
        worker = self._pool.checkout()
        assert worker is not None
        budget_s = self.limits.call_budget_ms / 1000
        try:
            worker.conn.send((expression, list(rows), self.limits.record_budget_ms / 1000))
            if not worker.conn.poll(budget_s):
                raise self._breach(f"evaluating {len(rows)} record(s) took longer than {self.limits.call_budget_ms} ms"
                                   " (wall time)")
            answer = worker.conn.recv()
        except (EOFError, OSError):
            self._pool.discard(worker)
            raise self._breach("the evaluator process died (memory limit?)") from None
        except ExpressionBudgetExceeded:
            self._pool.discard(worker)
            raise
        self._pool.checkin(worker)
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
