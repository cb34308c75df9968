"""Membership changes (SPEC §5): the calls (:mod:`broker.client.calls`) of ``add_node`` and
``remove_node``, made alike by the sync and asyncio clients."""

from __future__ import annotations

from broker.client.calls import AdminCall, nothing
from broker.v1 import admin_pb2


def add_node_call(node_id: str, raft_address: str, grpc_address: str) -> AdminCall[None]:
    """``AddNode``: make a running node a member (idempotent for the same addresses)."""
    request = admin_pb2.AddNodeRequest(id=node_id, raft_address=raft_address, grpc_address=grpc_address)
    return AdminCall("AddNode", request, f"add node {node_id}", nothing)


def remove_node_call(node_id: str) -> AdminCall[None]:
    """``RemoveNode``: take a member out (the leader hands leadership over first when it is the one)."""
    return AdminCall("RemoveNode", admin_pb2.RemoveNodeRequest(id=node_id), f"remove node {node_id}", nothing)
