"""Consumer groups over gRPC: the group RPCs of ``Broker`` and ``Admin``, mixed into their servicers.
Translation only; the logic is in ``broker.core.groups``, given to the servicers' constructors
(``broker.node_groups`` builds it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.leader.groups.delivery import GroupDelivery
from broker.leader.groups.operations import GroupOperations
from broker.leader.groups.service import GroupService
from broker.leader.reading import Step, Subscription
from broker.services import errors, wire
from broker.v1 import admin_pb2, broker_pb2

_GAUGES = (("lag", "raftbroker_group_lag_records", "Retained records the group has not settled"),
           ("in_flight", "raftbroker_group_in_flight", "Records leased to members right now (leader only)"),
           ("retrying", "raftbroker_group_retrying", "Records waiting for a retry"),
           ("dead", "raftbroker_group_dead_letters", "Dead letters of the group"))


class GroupBrokerMethods:
    """``Broker.Ack`` / ``Nack`` / ``Extend`` / ``Discard`` / ``Commit`` / ``JoinGroup`` /
    ``Heartbeat`` / ``LeaveGroup``, and group subscriptions (:meth:`group_subscribe`); the servicer's
    constructor sets both attributes."""

    _groups: GroupService
    _group_delivery: GroupDelivery

    def group_subscribe(self, request: Subscription, is_active: Callable[[], bool]) -> Iterator[Step]:
        """The step stream of a ``Subscribe`` that names a group (validated before it starts)."""
        return self._group_delivery.subscribe_steps(request, is_active)

    @errors.unary
    def Ack(self, request: broker_pb2.AckRequest, context: grpc.ServicerContext) -> broker_pb2.AckResponse:
        settled = self._groups.ack_each(request.topic, request.group, list(request.positions))
        return broker_pb2.AckResponse(settled=sum(settled), not_settled=[i for i, s in enumerate(settled) if not s])

    @errors.unary
    def Nack(self, request: broker_pb2.NackRequest, context: grpc.ServicerContext) -> broker_pb2.NackResponse:
        self._groups.nack(request.topic, request.group, list(request.positions), request.delay_ms, request.release)
        return broker_pb2.NackResponse()

    @errors.unary
    def Extend(self, request: broker_pb2.ExtendRequest, context: grpc.ServicerContext) -> broker_pb2.ExtendResponse:
        deadlines = self._groups.extend(request.topic, request.group, list(request.positions), request.extend_ms)
        return broker_pb2.ExtendResponse(deadlines_ms=deadlines)

    @errors.unary
    def Discard(self, request: broker_pb2.DiscardRequest, context: grpc.ServicerContext) -> broker_pb2.DiscardResponse:
        self._groups.discard(request.topic, request.group, list(request.positions), request.reason)
        return broker_pb2.DiscardResponse()

    @errors.unary
    def Commit(self, request: broker_pb2.CommitRequest, context: grpc.ServicerContext) -> broker_pb2.CommitResponse:
        self._groups.commit(request.topic, request.group, request.partition, request.offset)
        return broker_pb2.CommitResponse()

    @errors.unary
    def JoinGroup(self, request: broker_pb2.JoinGroupRequest,
                  context: grpc.ServicerContext) -> broker_pb2.JoinGroupResponse:
        member, partitions, session_ms = self._groups.join(request.topic, request.group, request.member_id,
                                                           wire.group_config(request.group_config))
        return broker_pb2.JoinGroupResponse(member_id=member, partitions=partitions, session_timeout_ms=session_ms)

    @errors.unary
    def Heartbeat(self, request: broker_pb2.HeartbeatRequest,
                  context: grpc.ServicerContext) -> broker_pb2.HeartbeatResponse:
        return broker_pb2.HeartbeatResponse(
            partitions=self._groups.heartbeat(request.topic, request.group, request.member_id))

    @errors.unary
    def LeaveGroup(self, request: broker_pb2.LeaveGroupRequest,
                   context: grpc.ServicerContext) -> broker_pb2.LeaveGroupResponse:
        self._groups.leave(request.topic, request.group, request.member_id)
        return broker_pb2.LeaveGroupResponse()


class GroupAdminMethods:
    """The ``Admin`` group RPCs; the servicer's constructor sets :attr:`_group_ops`."""

    _group_ops: GroupOperations

    @errors.unary
    def CreateGroup(self, request: admin_pb2.CreateGroupRequest,
                    context: grpc.ServicerContext) -> admin_pb2.GroupInfo:
        return wire.group_info(self._group_ops.create(request.topic, request.group, wire.group_config(request.config)))

    @errors.unary
    def DescribeGroup(self, request: admin_pb2.DescribeGroupRequest,
                      context: grpc.ServicerContext) -> admin_pb2.GroupInfo:
        return wire.group_info(self._group_ops.describe(request.topic, request.group))

    @errors.unary
    def ListGroups(self, request: admin_pb2.ListGroupsRequest,
                   context: grpc.ServicerContext) -> admin_pb2.ListGroupsResponse:
        views = self._group_ops.list_groups(request.topic)
        return admin_pb2.ListGroupsResponse(groups=[wire.group_info(v) for v in views])

    @errors.unary
    def DeleteGroup(self, request: admin_pb2.DeleteGroupRequest,
                    context: grpc.ServicerContext) -> admin_pb2.DeleteGroupResponse:
        self._group_ops.delete(request.topic, request.group)
        return admin_pb2.DeleteGroupResponse()

    @errors.unary
    def SeekGroup(self, request: admin_pb2.SeekGroupRequest,
                  context: grpc.ServicerContext) -> admin_pb2.SeekGroupResponse:
        partition = request.partition if request.HasField("partition") else None
        moved = self._group_ops.seek(request.topic, request.group, wire.position(request.to), partition)
        return admin_pb2.SeekGroupResponse(positions=[admin_pb2.PartitionOffset(partition=p, offset=o)
                                                      for p, o in moved])

    @errors.unary
    def GroupLag(self, request: admin_pb2.GroupLagRequest,
                 context: grpc.ServicerContext) -> admin_pb2.GroupLagResponse:
        return wire.group_lag(self._group_ops.lag(request.topic, request.group))

    @errors.unary
    def PauseGroups(self, request: admin_pb2.PauseGroupsRequest,
                    context: grpc.ServicerContext) -> admin_pb2.PauseGroupsResponse:
        return admin_pb2.PauseGroupsResponse(groups=self._group_ops.pause(request.topic, request.group, True))

    @errors.unary
    def ResumeGroups(self, request: admin_pb2.PauseGroupsRequest,
                     context: grpc.ServicerContext) -> admin_pb2.PauseGroupsResponse:
        return admin_pb2.PauseGroupsResponse(groups=self._group_ops.pause(request.topic, request.group, False))

    @errors.unary
    def ListDeadLetters(self, request: admin_pb2.ListDeadLettersRequest,
                        context: grpc.ServicerContext) -> admin_pb2.ListDeadLettersResponse:
        partition = request.partition if request.HasField("partition") else None
        after = request.after_offset if partition is not None and request.HasField("after_offset") else None
        dead = self._group_ops.dead_letters(request.topic, request.group, request.limit, partition, after)
        return wire.dead_letters(dead)

    @errors.unary
    def RetryDeadLetters(self, request: admin_pb2.RetryDeadLettersRequest,
                         context: grpc.ServicerContext) -> admin_pb2.RetryDeadLettersResponse:
        positions = [(m.partition, m.offset) for m in request.messages]
        done = self._group_ops.retry_dead_letters(request.topic, request.group, positions, request.all)
        return admin_pb2.RetryDeadLettersResponse(retried=done.retried, pruned=done.pruned)

    @errors.unary
    def MarkGroup(self, request: admin_pb2.MarkGroupRequest, context: grpc.ServicerContext) -> admin_pb2.GroupInfo:
        return wire.group_info(self._group_ops.mark(request.topic, request.group, request.role))

    @errors.unary
    def PurgeDeadLetters(self, request: admin_pb2.PurgeDeadLettersRequest,
                         context: grpc.ServicerContext) -> admin_pb2.PurgeDeadLettersResponse:
        purged = self._group_ops.purge_dead_letters(request.topic, request.group)
        return admin_pb2.PurgeDeadLettersResponse(purged=purged)


class GroupCollector(Collector):
    """Per group and partition: lag (records and seconds), in-flight leases, retries, dead letters;
    read at scrape time from this node's applied state (leases only on the leader)."""

    def __init__(self, ops: GroupOperations, counters: Callable[[], dict[str, int]]) -> None:
        self._ops = ops
        self._counters = counters

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["topic", "group", "partition"]
        families = {name: GaugeMetricFamily(metric, doc, labels=labels) for name, metric, doc in _GAUGES}
        seconds = GaugeMetricFamily("raftbroker_group_lag_seconds", "Age of the oldest unsettled record",
                                    labels=labels)
        for topic, group, row in self._ops.figures():
            key = [topic, group, str(row.partition)]
            for name, family in families.items():
                family.add_metric(key, float(getattr(row, name)))
            seconds.add_metric(key, row.lag_ms / 1000)
        yield from families.values()
        yield seconds
        for name, value in self._counters().items():
            yield CounterMetricFamily(f"raftbroker_group_{name}", f"Group records {name.replace('_', ' ')} "
                                      "(applied on this node)", value=value)
