"""Pools of helper processes for work whose cost a caller controls and the broker cannot bound
in-process: a user's CEL expression (:mod:`broker.leader.cel_sandbox`) and the explanation of a
value a schema refuses (:mod:`broker.leader.schema_explain`). Such work runs in native code that
holds the GIL, so run in the broker it would stop Raft and the gRPC server with it; here it runs in
a child process (``python -m MODULE FD MEMORY_BYTES``, address space capped at ``MEMORY_BYTES``)
that the broker waits on over a socket, without the GIL, and kills when it overruns.

The child's protocol: it sends ``("ready",)`` once started, then answers each request it receives
on the connection with one message, until the connection closes.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe

from broker.core.errors import Unavailable


def worker_main(serve: Callable[[Connection], None]) -> None:
    """A helper process's entry point: its address space capped at ``MEMORY_BYTES``, then
    ``serve`` on the connection whose descriptor ``FD`` it was given (``python -m MODULE FD MEMORY_BYTES``)."""
    fd, memory_bytes = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    serve(Connection(fd))


class Worker:
    """One helper process and the parent's end of its socket."""

    def __init__(self, module: str, memory_bytes: int, start_timeout_s: float) -> None:
        parent, child = Pipe(duplex=True)
        self.conn: Connection = parent
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, str(child.fileno()), str(memory_bytes)],
            pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL)
        child.close()
        try:
            if not self.conn.poll(start_timeout_s):
                raise TimeoutError
            self.conn.recv()  # ("ready",)
        except (EOFError, OSError, TimeoutError):  # it did not answer, or died on the way (killed)
            self.kill()
            raise Unavailable(f"the helper process {module} did not start") from None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.conn.close()


class WorkerPool:
    """Up to ``workers_max`` processes running ``module``, started on demand; thread-safe. A caller
    checks a worker out, talks to it, and checks it back in, or discards it (killed) when it
    overran or died."""

    def __init__(self, module: str, *, workers_max: int, memory_bytes: int, start_timeout_s: float) -> None:
        self.module = module
        self.workers_max = workers_max
        self.memory_bytes = memory_bytes
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Condition()
        self._idle: list[Worker] = []
        self._live = 0
        self._closed = False

    def checkout(self, *, wait: bool = True) -> Worker | None:
        """A worker: an idle one, a new one if fewer than ``workers_max`` live, else (``wait``) the
        next one checked in within ``start_timeout_s`` (Unavailable if none) or (not ``wait``) None."""
        deadline = time.monotonic() + self.start_timeout_s
        with self._lock:
            while not self._idle and self._live >= self.workers_max:
                if not wait:
                    return None
                if self._closed or not self._lock.wait(max(0.0, deadline - time.monotonic())):
                    raise Unavailable(f"every {self.module} process is busy")
            if self._idle:
                return self._idle.pop()
            self._live += 1
        try:
            return Worker(self.module, self.memory_bytes, self.start_timeout_s)
        except BaseException:
            with self._lock:
                self._live -= 1
                self._lock.notify()
            raise

    def checkin(self, worker: Worker) -> None:
        with self._lock:
            if self._closed:
                self._live -= 1
            else:
                self._idle.append(worker)
            self._lock.notify()
        if self._closed:
            worker.kill()

    def discard(self, worker: Worker) -> None:
        worker.kill()
        with self._lock:
            self._live -= 1
            self._lock.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
            self._lock.notify_all()
        for worker in idle:
            worker.kill()
