"""Prune roles of consumer groups (SPEC §2.2): a ``lead`` group may prune its topic up to what it
has committed; no explicit deletion (prune or clear) may pass what a ``protect`` group has not.

Both rules are decided when the prune command is applied, from the command and the store only,
so every node deletes the same prefix, and a group that seeks back between the leader's check and
the apply still holds its records. A group counts only while it follows the topic's current
incarnation. Retention caps (age, records, bytes) are limits the operator set on the topic and
are not held back by groups: a group behind them gets ``SKIP_FORWARD``.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.core.applied import CacheChanges, Rejected
from broker.core.errors import FailedPrecondition, GroupNotFound, InvalidArgument
from broker.core.groups import layout
from broker.core.state_machine import BrokerStateMachine
from broker.storage import Batch, Column
from broker.v1 import internal_pb2

K = internal_pb2
ROLE_NAMES = {internal_pb2.PRUNE_ROLE_NONE: "none", internal_pb2.PRUNE_ROLE_LEAD: "lead",
              internal_pb2.PRUNE_ROLE_PROTECT: "protect"}


class PruneRoles:
    """Applies ``MarkGroupCommand`` and limits prunes (the :class:`broker.core.retention.PruneGuard`)."""

    def __init__(self, state: BrokerStateMachine, touched: Callable[[int, CacheChanges], None]) -> None:
        self._sm = state
        self._touched = touched
        state.register("mark_group", self._apply_mark)

    def _apply_mark(self, cmd: K.MarkGroupCommand, batch: Batch, changes: CacheChanges) -> object:
        if cmd.role not in ROLE_NAMES:
            return Rejected(InvalidArgument(f"unknown prune role {cmd.role}"))
        meta = layout.get_meta(self._sm.store, cmd.topic, cmd.group)
        if meta is None:
            return Rejected(GroupNotFound(cmd.topic, cmd.group))
        if meta.prune_role != cmd.role:
            meta.prune_role = cmd.role
            batch.put(Column.GROUPS, layout.meta_key(meta.topic, meta.group), meta.SerializeToString())
            self._touched(meta.group_id, changes)
        return meta

    def limit(self, topic: K.TopicMeta, cmd: K.PruneCommand, targets: dict[int, int]) -> dict[int, int] | Rejected:
        """The prune's target per partition (delete below it), lowered to a lead group's committed
        positions; Rejected when it would pass a protecting group's. Nothing is written."""
        name = topic.config.name
        groups = [g for g in layout.topic_metas(self._sm.store, name) if g.topic_id == topic.topic_id]
        if cmd.group:
            lead = next((g for g in groups if g.group == cmd.group), None)
            if lead is None:
                if layout.get_meta(self._sm.store, name, cmd.group) is None:
                    return Rejected(GroupNotFound(name, cmd.group))
                return Rejected(FailedPrecondition(f"group {cmd.group!r} follows an earlier incarnation of topic "
                                                   f"{name!r}; it has committed nothing here to prune by"))
            if lead.prune_role != internal_pb2.PRUNE_ROLE_LEAD:
                return Rejected(FailedPrecondition(
                    f"group {cmd.group!r} of topic {name!r} is not marked lead (it is "
                    f"{ROLE_NAMES.get(lead.prune_role, '?')}); mark it first: raftbroker group mark {name} "
                    f"{cmd.group} --lead"))
            cursors = layout.get_cursors(self._sm.store, lead.group_id, lead.partitions)
            targets = {p: min(t, cursors[p].committed) for p, t in targets.items()}
        what = "clear" if cmd.clear else "prune"
        for guard in groups:
            if guard.prune_role != internal_pb2.PRUNE_ROLE_PROTECT:
                continue
            cursors = layout.get_cursors(self._sm.store, guard.group_id, guard.partitions)
            for p, target in sorted(targets.items()):
                start = self._sm.counters(topic.topic_id, p).start_offset
                if target > max(cursors[p].committed, start):
                    return Rejected(FailedPrecondition(
                        f"{what} of topic {name!r} refused: group {guard.group!r} protects partition {p} from "
                        f"offset {cursors[p].committed} (its committed position), and the {what} would delete "
                        f"up to offset {target}; nothing was deleted"))
        return targets
