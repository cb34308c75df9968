"""Consumer groups wired into one node (SPEC §3.2): the replicated group state, the leader's
lease/membership ticker, the group RPCs of ``Broker`` and ``Admin``, and the group metrics.

Construct it right after the state machine (its commands must be registered before the
replicator applies anything), :meth:`wire` it once the submitter, servicers and metrics exist,
then :meth:`start` and :meth:`stop` it with the node.
"""

from __future__ import annotations

from broker.clock import Clock
from broker.core.groups.apply import GroupApplier
from broker.core.retention import Retention
from broker.core.state_machine import BrokerStateMachine
from broker.leader.groups.delivery import GroupDelivery
from broker.leader.groups.operations import GroupOperations
from broker.leader.groups.service import GroupService
from broker.leader.reading import RESPONSE_BYTES_MAX
from broker.leader.submitter import CommandSubmitter
from broker.services.group_service import GroupAdminMethods, GroupBrokerMethods, GroupCollector
from broker.services.metrics import NodeMetrics


class NodeGroups:
    """Everything consumer groups add to a node."""

    def __init__(self, state: BrokerStateMachine, retention: Retention) -> None:
        self._state = state
        self.applier = GroupApplier(state)
        retention.set_prune_guard(self.applier.prune_roles)  # lead and protect groups (SPEC §2.2)
        self.service: GroupService | None = None

    def wire(self, *, submitter: CommandSubmitter, broker: GroupBrokerMethods, admin: GroupAdminMethods,
             metrics: NodeMetrics, clock: Clock, response_bytes_max: int = RESPONSE_BYTES_MAX) -> None:
        """Create the leader-side service and attach it to the servicers and the metrics; ``clock``
        (the node clock) stamps group commands (wall) and times leases and member sessions (monotonic);
        ``response_bytes_max`` bounds the records of one group stream response."""
        self.service = GroupService(self._state, self.applier, submitter, clock)
        broker.groups = self.service
        broker.group_delivery = GroupDelivery(self.service, response_bytes_max)
        admin.group_ops = GroupOperations(self.service)
        applier = self.applier
        metrics.registry.register(GroupCollector(admin.group_ops, lambda: {
            "dead_lettered": applier.dead_lettered, "retries_scheduled": applier.retries_scheduled}))

    def start(self) -> None:
        assert self.service is not None, "wire() first"
        self.service.start()

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
