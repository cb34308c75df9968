"""SIGTERM as an unwinding exception, for commands that own processes, leases or files.

Killed outright by SIGTERM (Python's default), a command skips every ``finally``: a consumer's
leases wait out their visibility timeout, a benchmark's nodes (in sessions of their own) keep
running and its temporary data stays. Inside :func:`sigterm_unwinds`, SIGTERM raises
:class:`Terminated` in the main thread instead; the command unwinds and exits
:data:`EXIT_TERMINATED` (128 + 15, what a shell reports for a process ended by SIGTERM).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

EXIT_TERMINATED = 128 + signal.SIGTERM


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, so that no retry loop's ``except Exception`` swallows it."""


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` in the main thread; a second SIGTERM is
    ignored, so it cannot break the unwinding the first one started. Elsewhere than in the main
    thread (no signal handler can be set there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
