"""Finding the field at fault in a value a recursive schema refuses, in a helper process with a
CPU budget (:mod:`broker.leader.schema_worker`; why: :mod:`broker.leader.schemas`).

The value is refused either way (the broker decided that itself, in linear time); this only
decides how precise the message is. So nothing here waits for long or queues: one helper process
at a time (a second explanation meanwhile gets the plain message at once), one second of its CPU
per value, and after a value overran its budget the next ``quiet_s`` seconds explain nothing, so a
caller who sends such values over and over costs the node a bounded share of one core.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import dataclass

from broker.core.errors import InvalidArgument, Unavailable
from broker.leader.worker_pool import WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExplainLimits:
    """``cpu_budget_s``: the helper's CPU per value (the kernel's limit has whole-second steps, so
    a value may take up to one second more); ``wall_budget_s``: how long a caller waits at most,
    on a machine too busy to give the helper its CPU; ``quiet_s``: no explanations after a breach."""

    cpu_budget_s: float = 1.0
    wall_budget_s: float = 10.0
    quiet_s: float = 10.0
    memory_bytes_max: int = 1 << 30
    start_timeout_s: float = 30.0
    compile_cpu_max_s: float = 0.1  # a schema's compile, measured in the helper before a create

    def __post_init__(self) -> None:
        assert 0 < self.cpu_budget_s <= self.wall_budget_s <= 60, (self.cpu_budget_s, self.wall_budget_s)
        assert 0 <= self.quiet_s <= 3600, self.quiet_s
        assert self.memory_bytes_max >= 64 << 20, self.memory_bytes_max
        assert self.start_timeout_s > 0, self.start_timeout_s


class SchemaExplainer:
    """Thread-safe; ``explain`` never raises for the value's sake."""

    def __init__(self, limits: ExplainLimits = ExplainLimits()) -> None:
        self.limits = limits
        self._pool = WorkerPool("broker.leader.schema_worker", workers_max=1, memory_bytes=limits.memory_bytes_max,
                                start_timeout_s=limits.start_timeout_s)
        self._lock = threading.Lock()
        self._quiet_until = 0.0
        self.breaches = 0

    def explain(self, schema_json: str, value: bytes) -> str:
        """``field PATH: RULE``, or a sentence saying why the field was not looked for."""
        with self._lock:
            if time.monotonic() < self._quiet_until:
                return ("the value does not satisfy the topic's schema (the field at fault was not looked for: "
                        "a value shortly before took more than the search's budget)")
        try:
            worker = self._pool.checkout(wait=False)
        except Unavailable:  # the helper did not start (killed on the way, no memory): refused plainly
            return ("the value does not satisfy the topic's schema (the field at fault was not looked for: "
                    "its helper process did not start)")
        if worker is None:
            return ("the value does not satisfy the topic's schema (the field at fault was not looked for: "
                    "another value's search is running)")
        try:
            worker.conn.send((schema_json, value, self.limits.cpu_budget_s))
            if not worker.conn.poll(self.limits.wall_budget_s):
                raise TimeoutError
            answer = worker.conn.recv()
        except (EOFError, OSError, TimeoutError):
            self._pool.discard(worker)
            with self._lock:
                self.breaches += 1
                self._quiet_until = time.monotonic() + self.limits.quiet_s
            log.warning("schema: finding the field at fault in a refused value took more than %.0f s of CPU "
                        "(or the helper died); the record was refused with a plain message", self.limits.cpu_budget_s)
            return (f"the value does not satisfy the topic's schema (the field at fault was not found within "
                    f"{self.limits.cpu_budget_s:g} s of CPU: the schema refers to itself and the value is deep)")
        except BaseException:
            self._pool.discard(worker)
            raise
        self._pool.checkin(worker)
        message: str | None = answer[1]
        return message or "the value does not satisfy the topic's schema"

    def check_compile(self, schema_json: str) -> None:
        """Compile ``schema_json`` in the helper first: InvalidArgument if it is refused, or if the
        compile takes more than ``compile_cpu_max_s`` of CPU or the helper's memory. The broker
        compiles it again for each leader's first publish, holding the GIL (jsonschema-rs does):
        7,000 ``patternProperties`` of ``^\\w{N}$`` took 7-17 s and 3.6 GB, and every leader lost its
        leadership in turn. Unavailable when the helper cannot be had."""
        worker = self._pool.checkout()
        assert worker is not None
        budget_s = max(1.0, self.limits.compile_cpu_max_s)
        try:
            worker.conn.send((schema_json, None, budget_s))
            if not worker.conn.poll(self.limits.wall_budget_s):
                raise TimeoutError
            kind, answer = worker.conn.recv()
        except (EOFError, OSError, TimeoutError):
            self._pool.discard(worker)
            raise InvalidArgument(
                f"schema: compiling it took more than {budget_s:g} s of CPU or {self.limits.memory_bytes_max >> 20} "
                "MiB of memory (its patterns: fewer of them, or smaller repetitions such as \\w{N})") from None
        except BaseException:
            self._pool.discard(worker)
            raise
        self._pool.checkin(worker)
        if kind == "refused":
            raise InvalidArgument(str(answer))
        if float(answer) > self.limits.compile_cpu_max_s:
            raise InvalidArgument(
                f"schema: compiling it took {float(answer):.2f} s of CPU, more than "
                f"{self.limits.compile_cpu_max_s:g} s: each leader compiles it holding the broker's interpreter "
                "lock; use fewer patterns, or smaller repetitions such as \\w{N}")

    def close(self) -> None:
        self._pool.close()


_shared: SchemaExplainer | None = None
_shared_lock = threading.Lock()


def shared() -> SchemaExplainer:
    """The process's explainer."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SchemaExplainer()
            atexit.register(_shared.close)
        return _shared
