"""``Admin.AddNode`` / ``Admin.RemoveNode``: a mixin of ``AdminServicer`` delegating to
``broker.leader.membership.MembershipChanges`` (the node sets :attr:`membership`)."""

from __future__ import annotations

import grpc

from broker.core.errors import Unimplemented
from broker.leader.membership import MembershipChanges
from broker.services import errors
from broker.v1 import admin_pb2


class MembershipAdminMethods:
    """Membership RPCs; answered by the leader (followers redirect with x-leader)."""

    membership: MembershipChanges | None = None

    def _changes(self) -> MembershipChanges:
        if self.membership is None:
            raise Unimplemented("membership changes are not wired on this node")
        return self.membership

    @errors.unary
    def AddNode(self, request: admin_pb2.AddNodeRequest,  # noqa: N802 (gRPC's name)
                context: grpc.ServicerContext) -> admin_pb2.MembershipResponse:
        self._changes().add(request.id, request.raft_address, request.grpc_address)
        return admin_pb2.MembershipResponse()

    @errors.unary
    def RemoveNode(self, request: admin_pb2.RemoveNodeRequest,  # noqa: N802
                   context: grpc.ServicerContext) -> admin_pb2.MembershipResponse:
        self._changes().remove(request.id)
        return admin_pb2.MembershipResponse()
