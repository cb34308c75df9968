"""Which retry entries of a group each recent apply wrote, for the group runtimes on the leader."""

from __future__ import annotations

import collections
import threading

from broker.core.groups.apply import Position

# how many changed retry positions are remembered, over all groups (oldest forgotten first): ~120
# bytes each, so a few MiB at most; a runtime further behind re-reads all its retry entries
RETRY_CHANGES_MAX = 16_384


class GroupVersions:
    """:class:`~broker.core.groups.apply.GroupWrites` of a node. Per group: a version bumped after
    every apply that wrote the group, and, for the recent ones, which retry entries each apply
    wrote. A leader-side reader then re-reads those entries, not all of them: a group with thousands
    of records waiting for a retry would otherwise cost a scan of them all after every ack. A cache,
    never replicated: written by the apply thread once the batch is written (a version is logged
    before it is published), read from any thread.

    At most :data:`RETRY_CHANGES_MAX` positions are remembered over all groups; the oldest versions
    are forgotten first, and :meth:`retries_changed` says when what a reader asks for is gone."""

    def __init__(self, positions_max: int = RETRY_CHANGES_MAX) -> None:
        self._positions_max = positions_max
        self._lock = threading.Lock()
        self._versions: dict[int, int] = {}
        self._logs: dict[int, collections.deque[tuple[int, frozenset[Position] | None]]] = {}
        self._order: collections.deque[tuple[int, int]] = collections.deque()  # (gid, size), oldest first
        self._forgotten: dict[int, int] = {}  # gid -> its newest version no longer logged
        self._logged = 0

    def version(self, gid: int) -> int:
        """Changes after every apply that wrote group ``gid``."""
        return self._versions.get(gid, 0)

    def bump(self, gid: int, retries: frozenset[Position] | None) -> None:
        """Group ``gid`` was written; ``retries``: the positions whose retry entry changed (None: not
        known one by one, e.g. a range delete)."""
        size = 1 if retries is None else max(len(retries), 1)
        with self._lock:
            version = self._versions.get(gid, 0) + 1
            self._logs.setdefault(gid, collections.deque()).append((version, retries))
            self._order.append((gid, size))
            self._logged += size
            while self._logged > self._positions_max and len(self._order) > 1:
                old_gid, old_size = self._order.popleft()
                log = self._logs[old_gid]
                self._forgotten[old_gid] = log.popleft()[0]
                if not log:
                    del self._logs[old_gid]
                self._logged -= old_size
            self._versions[gid] = version

    def retries_changed(self, gid: int, since: int) -> set[Position] | None:
        """The positions whose retry entry the applies after version ``since`` of ``gid`` wrote (and
        perhaps later ones'); None when they are not all known."""
        with self._lock:
            if since < 0 or self._forgotten.get(gid, 0) > since:
                return None
            changed: set[Position] = set()
            for version, retries in reversed(self._logs.get(gid, ())):
                if version <= since:
                    break
                if retries is None:
                    return None
                changed |= retries
            return changed
