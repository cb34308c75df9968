"""``Admin.AddNode`` / ``Admin.RemoveNode``: a mixin of ``AdminServicer`` delegating to
``broker.leader.membership.MembershipChanges`` (given to the servicer's constructor)."""

from __future__ import annotations

import grpc

from broker.leader.membership import MembershipChanges
from broker.services import errors
from broker.v1 import admin_pb2

ANSWER_MARGIN_S = 3.0  # of an AddNode's deadline, kept for the change itself after the new node answered


class MembershipAdminMethods:
    """Membership RPCs; answered by the leader (followers redirect with x-leader). The servicer's
    constructor sets :attr:`_membership`."""

    _membership: MembershipChanges

    @errors.unary
    def AddNode(self, request: admin_pb2.AddNodeRequest,  # noqa: N802 (gRPC's name)
                context: grpc.ServicerContext) -> admin_pb2.MembershipResponse:
        remaining = context.time_remaining()  # answer before the caller's deadline, leaving time for the change
        wait_s = None if remaining is None else max(0.0, remaining - ANSWER_MARGIN_S)
        self._membership.add(request.id, request.raft_address, request.grpc_address, answer_wait_s=wait_s)
        return admin_pb2.MembershipResponse()

    @errors.unary
    def RemoveNode(self, request: admin_pb2.RemoveNodeRequest,  # noqa: N802
                   context: grpc.ServicerContext) -> admin_pb2.MembershipResponse:
        self._membership.remove(request.id)
        return admin_pb2.MembershipResponse()
