"""The change signal readers wait on: a version number bumped after every apply that changed
topics or records, and whenever a leader-side component wakes readers itself (an ephemeral
publish, a settled lease). Implements ``broker.core.state_machine.ChangeSignal``; one per node,
handed to the state machine when the node builds it.
"""

from __future__ import annotations

import threading


class Changes:
    """A version counter with a condition variable; every method is thread-safe."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def notify(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def wait(self, seen_version: int, timeout_s: float) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self._version != seen_version, timeout_s)
            return self._version
