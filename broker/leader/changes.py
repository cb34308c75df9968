"""The change signal readers wait on: a version number bumped after every apply that changed
topics or records, and whenever a leader-side component wakes readers itself (an ephemeral
publish, a settled lease). Implements ``broker.core.state_machine.ChangeSignal``; one per node,
handed to the state machine when the node builds it.

Two ways to hear of a change: a thread blocks in :meth:`Changes.wait` (the router, sync reads), or a
listener added with :meth:`Changes.add_listener` is called by whoever notifies, right after the
version moved (the event loop's change feed, ``broker.services.streams.ChangeFeed``, which so needs
no thread of its own: a waiting thread cost every node two context switches per apply).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Changes:
    """A version counter with a condition variable and listeners; every method is thread-safe."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._version = 0
        self._listeners: tuple[Callable[[], None], ...] = ()  # replaced whole: notify reads it unlocked

    @property
    def version(self) -> int:
        return self._version

    def notify(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # noqa: BLE001 - a listener must not break the apply that notified
                log.exception("change listener %r failed", listener)

    def wait(self, seen_version: int, timeout_s: float) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self._version != seen_version, timeout_s)
            return self._version

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every :meth:`notify`, after the version moved, on the notifying
        thread (the apply's, often): it must be quick, and must not block or call back in here."""
        with self._changed:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling ``listener``; matched with ``==``, as a bound method is a new object each time."""
        with self._changed:
            self._listeners = tuple(known for known in self._listeners if known != listener)
