"""Raising the cluster's command format (leader only; docs/design/command-formats.md, points 2-3).

The cluster's format (``broker/core/formats.py``) says which command formats the leader may
build. :meth:`FormatRaiser.raise_if_ready`, a housekeeping task, asks every voting member which
formats its code applies (its ``NodeStatus``) and, when all of them apply a format above the
cluster's, submits ``set_format`` of the lowest of them. A member that does not answer, or whose
gRPC address this node does not know, holds the format where it is: the rule is that no committed
command may use a format a live member cannot apply. ``hold`` (``hold_command_format``) keeps the
format where it is through a rollback window: a release that applies only the current format can
still be rolled back to.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.core import formats
from broker.core.applied import Rejected
from broker.core.members import Peer
from broker.leader.submitter import CommandSubmitter

log = logging.getLogger(__name__)


class FormatRaiser:
    """Submits ``set_format`` once every member's code applies a newer format than the cluster's."""

    def __init__(self, cluster_format: Callable[[], int], members: Callable[[], list[Peer]],
                 member_formats: Callable[[list[Peer]], list[int | None]], submitter: CommandSubmitter, *,
                 self_id: str, hold: bool = False) -> None:
        """``members()``: the voting members now; ``member_formats(peers)``: the newest format each
        of those members' code applies (asked in parallel), None for one that does not answer."""
        self._cluster_format = cluster_format
        self._members = members
        self._member_formats = member_formats
        self._submitter = submitter
        self._self_id = self_id
        self._hold = hold
        self._held_logged = -1

    def members_formats(self) -> dict[str, int | None]:
        """Each voting member's apply format (this node's own without asking), by node id."""
        others = [p for p in self._members() if p.node_id != self._self_id]
        found: dict[str, int | None] = {self._self_id: formats.APPLY_FORMAT}
        found.update(zip((p.node_id for p in others), self._member_formats(others), strict=True))
        return found

    def target(self) -> int | None:
        """The format every member applies, when it is above the cluster's; else None."""
        current = self._cluster_format()
        if current >= formats.APPLY_FORMAT:
            return None
        found = list(self.members_formats().values())
        if None in found:
            return None
        lowest = min(f for f in found if f is not None)
        return lowest if lowest > current else None

    def raise_if_ready(self) -> None:
        """Submit ``set_format`` when every member is ready (leader only; a housekeeping task)."""
        target = self.target()
        if target is None:
            return
        if self._hold:
            if self._held_logged != target:
                log.warning("every member applies command format %d, and hold_command_format keeps the cluster at "
                            "%d: unset it once no rollback is wanted", target, self._cluster_format())
                self._held_logged = target
            return
        result = self._submitter.submit(formats.set_format_command(target), sync=True)
        if isinstance(result, Rejected):
            raise result.error
        log.info("raised the cluster's command format to %d (every member applies it)", target)
