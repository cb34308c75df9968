"""``broker.v1.Admin``: topics and cluster status, delegated to ``broker.core``."""

from __future__ import annotations

import os
from collections.abc import Callable

import grpc

from broker.core import formats
from broker.core.apply_digest import ApplyDigests
from broker.core.errors import ResourceExhausted
from broker.core.members import Peer
from broker.leader.groups.operations import GroupOperations
from broker.leader.membership import MembershipChanges
from broker.leader.route_admin import RouteAdmin
from broker.leader.submitter import PeerDirectory
from broker.leader.topic_log import TopicLog
from broker.replication import Replicator
from broker.services import errors, wire
from broker.services.group_service import GroupAdminMethods
from broker.services.membership_service import MembershipAdminMethods
from broker.services.peer_status import PeerStatus
from broker.services.route_service import RouteAdminMethods
from broker.v1 import admin_pb2, admin_pb2_grpc

# One topic listing at most (topic schemas are unbounded but for the message limit): past it
# ListTopics (schemas left out: has_schema) past this fails with RESOURCE_EXHAUSTED and says what to do,
# rather than with a transport error.
LIST_TOPICS_BYTES_MAX = 4 << 20


class AdminServicer(GroupAdminMethods, MembershipAdminMethods, RouteAdminMethods, admin_pb2_grpc.AdminServicer):
    """Control plane (group, membership and route RPCs: the mixins, whose services are given here)."""

    def __init__(self, log: TopicLog, replicator: Replicator, me: Peer, peers: PeerDirectory, *,
                 membership: MembershipChanges, group_ops: GroupOperations, route_admin: RouteAdmin,
                 peer_status: PeerStatus, cluster_format: Callable[[], int],
                 digests: Callable[[], ApplyDigests]) -> None:
        """``cluster_format()``: the cluster's command format as this node applied it; ``digests()``:
        this node's apply digests."""
        self._log = log
        self._membership = membership
        self._group_ops = group_ops
        self._route_admin = route_admin
        self._replicator = replicator
        self._me = me
        self._peers = peers
        self._peer_status = peer_status
        self._cluster_format = cluster_format
        self._digests = digests

    @errors.unary
    def CreateTopic(self, request: admin_pb2.CreateTopicRequest, context: grpc.ServicerContext) -> admin_pb2.TopicInfo:
        return wire.topic_info(self._log.create_topic(wire.topic_config(request.config)))

    @errors.unary
    def DescribeTopic(self, request: admin_pb2.DescribeTopicRequest,
                      context: grpc.ServicerContext) -> admin_pb2.TopicInfo:
        return wire.topic_info(self._log.describe_topic(request.name))

    @errors.unary
    def ListTopics(self, request: admin_pb2.ListTopicsRequest,
                   context: grpc.ServicerContext) -> admin_pb2.ListTopicsResponse:
        response = admin_pb2.ListTopicsResponse(
            topics=[wire.topic_info(view, with_schema=False) for view in self._log.list_topics()])
        size = response.ByteSize()
        if size > LIST_TOPICS_BYTES_MAX:
            raise ResourceExhausted(
                f"the list of {len(response.topics)} topics is {size} bytes, over the {LIST_TOPICS_BYTES_MAX} "
                "bytes one answer may carry; describe topics one by one instead")
        return response

    @errors.unary
    def DropTopic(self, request: admin_pb2.DropTopicRequest,
                  context: grpc.ServicerContext) -> admin_pb2.DropTopicResponse:
        self._log.drop_topic(request.name)
        return admin_pb2.DropTopicResponse()

    @errors.unary
    def NodeStatus(self, request: admin_pb2.NodeStatusRequest, context: grpc.ServicerContext) -> admin_pb2.NodeInfo:
        return self._local_info()

    @errors.unary
    def ClusterStatus(self, request: admin_pb2.ClusterStatusRequest,
                      context: grpc.ServicerContext) -> admin_pb2.ClusterStatusResponse:
        others = [p for p in self._peers.all() if p.node_id != self._me.node_id]
        infos = [self._local_info(), *self._peer_status.infos(others)]
        infos.sort(key=lambda n: n.id)
        leaders = {n.id for n in infos if n.reachable and n.role == "leader"}
        return admin_pb2.ClusterStatusResponse(nodes=infos, leader_id=next(iter(leaders)) if len(leaders) == 1 else "")

    @errors.unary
    def ApplyDigest(self, request: admin_pb2.ApplyDigestRequest,
                    context: grpc.ServicerContext) -> admin_pb2.ApplyDigestResponse:
        index = request.index or self._replicator.status().applied_index
        digest, started = self._local_digest(index)
        return admin_pb2.ApplyDigestResponse(index=index, digest=digest, started_index=started)

    @errors.unary
    def VerifyReplicas(self, request: admin_pb2.VerifyReplicasRequest,
                       context: grpc.ServicerContext) -> admin_pb2.VerifyReplicasResponse:
        return self.verify_replicas()

    def verify_replicas(self) -> admin_pb2.VerifyReplicasResponse:
        """Every member's apply digest compared at one index (also the leader's periodic check)."""
        others = [p for p in self._peers.all() if p.node_id != self._me.node_id]
        return self._peer_status.verify(self._local_info, self._local_digest, others)

    def _local_digest(self, index: int) -> tuple[int, int]:
        return self._digests().at(index, self._replicator.status().applied_index)

    def _local_info(self) -> admin_pb2.NodeInfo:
        st = self._replicator.status()
        leader = self._peers.by_raft(st.leader_address)
        return admin_pb2.NodeInfo(
            id=self._me.node_id, grpc_address=self._me.grpc_address, raft_address=self._me.raft_address,
            metrics_address=self._me.metrics_address, role=st.role.value, term=st.term,
            commit_index=st.commit_index, applied_index=st.applied_index, pid=os.getpid(),
            leader_id=leader.node_id if leader else "", reachable=True,
            apply_format=formats.APPLY_FORMAT, cluster_format=self._cluster_format())

    @errors.unary
    def AlterTopic(self, request: admin_pb2.AlterTopicRequest, context: grpc.ServicerContext) -> admin_pb2.TopicInfo:
        return wire.topic_info(self._log.alter_topic(request.name, wire.retention(request.retention),
                                                     request.full_policy))

    @errors.unary
    def ClearTopic(self, request: admin_pb2.ClearTopicRequest,
                   context: grpc.ServicerContext) -> admin_pb2.ClearTopicResponse:
        self._log.clear_topic(request.name)
        return admin_pb2.ClearTopicResponse()

    @errors.unary
    def Prune(self, request: admin_pb2.PruneRequest, context: grpc.ServicerContext) -> admin_pb2.PruneResponse:
        partition = request.partition if request.HasField("partition") else None
        return admin_pb2.PruneResponse(records_pruned=self._log.prune(request.topic, partition, request.before_offset,
                                                                      request.group))

    @errors.unary
    def GetWatermarks(self, request: admin_pb2.GetWatermarksRequest,
                      context: grpc.ServicerContext) -> admin_pb2.GetWatermarksResponse:
        marks, more = self._log.watermarks_page(request.topic, request.after_dedup_id, request.limit)
        return admin_pb2.GetWatermarksResponse(
            watermarks=[admin_pb2.Watermark(dedup_id=d, msg_id=m) for d, m in marks], more=more)

    @errors.unary
    def ResetWatermark(self, request: admin_pb2.ResetWatermarkRequest,
                       context: grpc.ServicerContext) -> admin_pb2.ResetWatermarkResponse:
        return admin_pb2.ResetWatermarkResponse(existed=self._log.reset_watermark(request.topic, request.dedup_id))

    def close(self) -> None:
        self._peer_status.close()
