"""Consumer groups wired into one node (SPEC §3.2): the replicated group state, the leader's
lease/membership ticker, the services the group RPCs of ``Broker`` and ``Admin`` delegate to, and
the group metrics.

Two steps, in the node's one pass: :func:`group_applier` right after the state machine (its
commands must be registered before the replicator applies anything), :class:`NodeGroups` once the
submitter and metrics exist (its services are then given to the servicers' constructors); then
:meth:`NodeGroups.start` and :meth:`NodeGroups.stop` with the node.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.clock import Clock
from broker.core.groups.apply import GroupApplier
from broker.core.retention import Retention
from broker.core.state_machine import BrokerStateMachine
from broker.core.topics import TOPICS_MAX
from broker.leader.groups.delivery import GroupDelivery
from broker.leader.groups.operations import GroupOperations
from broker.leader.groups.service import GroupService
from broker.leader.groups.versions import GroupVersions
from broker.leader.reading import RESPONSE_BYTES_MAX
from broker.leader.submitter import CommandSubmitter
from broker.services.group_service import GroupCollector
from broker.services.metrics import NodeMetrics


def group_applier(state: BrokerStateMachine, retention: Retention) -> GroupApplier:
    """The replicated group state, registered on ``state``; lead and protect groups limit prunes
    (SPEC §2.2)."""
    applier = GroupApplier(state, GroupVersions())
    retention.set_prune_guard(applier.prune_roles)
    return applier


class NodeGroups:
    """The leader-side group services of a node: :attr:`service` (Broker group RPCs),
    :attr:`delivery` (group subscriptions) and :attr:`operations` (Admin group RPCs)."""

    def __init__(self, state: BrokerStateMachine, applier: GroupApplier, *, submitter: CommandSubmitter,
                 metrics: NodeMetrics, clock: Clock, response_bytes_max: int = RESPONSE_BYTES_MAX,
                 topics_max: int = TOPICS_MAX,
                 held: Callable[[int], frozenset[int]] = lambda topic_id: frozenset()) -> None:
        """``clock`` (the node clock) stamps group commands (wall) and times leases and member
        sessions; ``response_bytes_max`` bounds the records of one group stream response; ``held``:
        the `memory` partitions this node still takes back (``GroupService``)."""
        self.service = GroupService(state, applier, submitter, clock, topics_max=topics_max, held=held)
        self.delivery = GroupDelivery(self.service, response_bytes_max)
        self.operations = GroupOperations(self.service)
        metrics.registry.register(GroupCollector(self.operations, lambda: {
            "dead_lettered": applier.dead_lettered, "retries_scheduled": applier.retries_scheduled}))

    def start(self) -> None:
        self.service.start()

    def stop(self) -> None:
        self.service.stop()
