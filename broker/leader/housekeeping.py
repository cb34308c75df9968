"""Leader housekeeping: periodic replicated maintenance commands (dedup expiry for now)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker.core.errors import BrokerError

log = logging.getLogger(__name__)


class Housekeeper:
    """Runs ``tasks`` every ``period_s`` on a daemon thread; a task that fails (e.g. this node is
    not the leader) is simply tried again next period."""

    def __init__(self, tasks: list[Callable[[], None]], is_leader: Callable[[], bool], period_s: float) -> None:
        self._tasks = tasks
        self._is_leader = is_leader
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="housekeeping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._period_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            if not self._is_leader():
                continue
            for task in self._tasks:
                try:
                    task()
                except BrokerError as exc:
                    log.debug("housekeeping task skipped: %s", exc)
