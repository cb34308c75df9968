"""Leader housekeeping: periodic maintenance on the leader (dedup expiry, retention by age, the
cluster's command format, the replicas' apply digests)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from broker.core.errors import BrokerError

log = logging.getLogger(__name__)

LEADER_POLL_S = 0.5  # how soon a node that became leader runs the tasks (when the period is longer)


class Housekeeper:
    """Runs ``tasks`` on a daemon thread while this node leads: at once when it becomes the leader,
    then every ``period_s``. A task that fails is tried again next period: a BrokerError (e.g. this
    node stopped leading) quietly, anything else logged with its traceback; no task stops the others
    or the thread."""

    def __init__(self, tasks: list[Callable[[], None]], is_leader: Callable[[], bool], period_s: float,
                 clock: Callable[[], float] = time.monotonic, on_lead: Sequence[Callable[[], None]] = (),
                 on_step_down: Sequence[Callable[[], None]] = ()) -> None:
        """``on_lead``: called each time this node becomes the leader, before the tasks run (e.g. a
        task with a period of its own makes itself due, so that a node leading again does not go on
        from what it found when it last led). ``on_step_down``: called once each time it stops
        leading (e.g. what only a leader holds is let go)."""
        self._tasks = tasks
        self._on_lead = list(on_lead)
        self._on_step_down = list(on_step_down)
        self._is_leader = is_leader
        self._period_s = period_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="housekeeping", daemon=True)
        self._leading = False
        self._next_run = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._period_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(min(self._period_s, LEADER_POLL_S)):
            self.tick()

    def tick(self) -> None:
        """One wake-up of the thread: run the tasks if this node just became the leader or a period
        has passed since they last ran."""
        if not self._is_leader():
            if self._leading:
                for step_down in self._on_step_down:
                    try:
                        step_down()
                    except Exception:  # noqa: BLE001 - as for tasks: logged, the thread goes on
                        log.exception("housekeeping: %s failed on stepping down",
                                      getattr(step_down, "__qualname__", step_down))
            self._leading = False
            return
        now = self._clock()
        if self._leading and now < self._next_run:
            return
        became_leader = not self._leading
        self._leading, self._next_run = True, now + self._period_s
        for task in [*self._on_lead, *self._tasks] if became_leader else self._tasks:
            try:
                task()
            except BrokerError as exc:
                log.debug("housekeeping task skipped: %s", exc)
            except Exception:  # noqa: BLE001 - a bug in one task must not end housekeeping
                log.exception("housekeeping task %s failed; it runs again next period",
                              getattr(task, "__qualname__", task))
