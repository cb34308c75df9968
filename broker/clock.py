"""The node clock: the wall clock every leader-side timestamp and broker-owned timeout reads.

One :class:`NodeClock` per node, built by the node, is handed (as a :class:`Clock`) to every
leader-side component that reads time: ``TopicLog``, ``TrustedAppender``, ``RouteAdmin`` and the
group service; none of them reads ``time`` itself. What must not wait for the size of a jump does
not read the wall clock: group leases, member sessions and revocations are leader-local and run on
the clock's monotonic reading (:meth:`Clock.monotonic_ms`); a retry is also due when its
``due_ms`` is further away than its delay; dedup windows run at ``max(now_ms, the latest time a key
was remembered)`` (``broker.core.dedup.window_now_ms``). In production its offset is 0 and
``now_ms`` is ``time.time()`` in milliseconds. Tests and drills may shift it: with
``RAFTBROKER_CLOCK_FILE`` naming a file, a daemon thread re-reads that file every ``POLL_S`` and
takes its content (an integer, in ms) as the offset; a missing or empty file means 0; a bad value
is logged and ignored (the offset stays).

Only wall-time readings move. Elapsed-time waits (commit timeout, housekeeping period, leadership
hand-over, router backoff) use ``time.monotonic()`` or ``Event.wait`` and Raft's election timers
are pysyncobj's own: a jumped node clock does not touch them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

ENV_CLOCK_FILE = "RAFTBROKER_CLOCK_FILE"
POLL_S = 0.05
OFFSET_MS_MAX = 10 * 365 * 24 * 3600 * 1000  # a sanity bound: ten years either way


class Clock(Protocol):
    """What the leader side reads time through (one per node; tests pass a :class:`ManualClock`)."""

    def now_ms(self) -> int:
        """Wall milliseconds since the epoch, as this node believes them: stamped into commands
        (record timestamps, retry due times, dedup windows) and shown to clients."""
        ...

    def monotonic_ms(self) -> int:
        """Milliseconds on a clock that never jumps (its origin means nothing): lease deadlines,
        member sessions and revocations, which live only in this leader's memory."""
        ...


class NodeClock:
    """Wall-clock milliseconds plus an offset; ``now_ms`` reads one attribute and never a file."""

    def __init__(self, offset_ms: int = 0, offset_file: Path | None = None) -> None:
        assert abs(offset_ms) <= OFFSET_MS_MAX
        self._offset_ms = offset_ms
        self._file = offset_file
        self._bad: str | None = None  # the last bad content logged (each distinct one logged once)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if offset_file is not None:
            self.poll()  # the first readings of a starting node already see the file's offset

    @classmethod
    def from_env(cls) -> NodeClock:
        """The production clock (offset 0), or a file-driven one when ``RAFTBROKER_CLOCK_FILE`` is set."""
        name = os.environ.get(ENV_CLOCK_FILE, "")
        return cls(offset_file=Path(name) if name else None)

    @property
    def offset_ms(self) -> int:
        return self._offset_ms

    def now_ms(self) -> int:
        """Milliseconds since the epoch as this node believes them (wall clock + offset)."""
        return int(time.time() * 1000) + self._offset_ms

    def monotonic_ms(self) -> int:
        """This process's monotonic clock in ms; the offset does not move it."""
        return int(time.monotonic() * 1000)

    def set_offset_ms(self, offset_ms: int) -> None:
        """Shift this clock (tests); logs one line when the offset changes."""
        if not -OFFSET_MS_MAX <= offset_ms <= OFFSET_MS_MAX:
            raise ValueError(f"clock offset {offset_ms} ms is beyond {OFFSET_MS_MAX} ms")
        if offset_ms != self._offset_ms:
            self._offset_ms = offset_ms  # one attribute store: readers see the old or the new offset
            log.info("clock offset now %+d ms", offset_ms)

    def poll(self) -> None:
        """Read the offset file once (missing or empty: 0; a bad value: logged, offset kept)."""
        assert self._file is not None
        try:
            text = self._file.read_text().strip()
        except FileNotFoundError:
            text = ""
        except OSError as err:
            self._report_bad(f"unreadable: {err}")
            return
        try:
            self.set_offset_ms(int(text) if text else 0)
            self._bad = None
        except ValueError:
            self._report_bad(repr(text[:64]))

    def _report_bad(self, what: str) -> None:
        if what != self._bad:
            self._bad = what
            log.warning("clock file %s: bad offset %s (keeping %+d ms)", self._file, what, self._offset_ms)

    def start(self) -> None:
        """Start watching the offset file (no-op without one)."""
        if self._file is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, name="clock-file", daemon=True)
        self._thread.start()
        log.info("clock offset follows %s (now %+d ms)", self._file, self._offset_ms)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a test hook must never take the node down; it is logged
                log.exception("clock file poll failed")


class ManualClock:
    """A :class:`Clock` that moves only when told (unit tests and simulations). ``wall_ms`` and
    ``mono_ms`` are its two readings; :meth:`advance` lets time pass (both move), :meth:`step_wall`
    sets the wall clock (only it moves, either way: a jump)."""

    def __init__(self, wall_ms: int = 1_000_000, mono_ms: int = 1_000_000) -> None:
        self.wall_ms = wall_ms
        self.mono_ms = mono_ms

    def now_ms(self) -> int:
        return self.wall_ms

    def monotonic_ms(self) -> int:
        return self.mono_ms

    def advance(self, ms: int) -> None:
        """Let ``ms`` (>= 0) pass on both readings."""
        if ms < 0:
            raise ValueError(f"time does not pass backwards ({ms} ms); use step_wall for a jump")
        self.wall_ms += ms
        self.mono_ms += ms

    def step_wall(self, ms: int) -> None:
        """Jump the wall reading by ``ms`` (negative: back); the monotonic reading stays."""
        self.wall_ms += ms
