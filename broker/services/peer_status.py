"""Asking other nodes for their ``NodeStatus`` over gRPC: ``ClusterStatus`` gathers every member's
view with it, and the leader reads the members' command formats with it (``broker/leader/formats``).
A channel per address is kept open; a node that does not answer within
:data:`PEER_STATUS_TIMEOUT_S` is reported unreachable."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import grpc

from broker.core.members import Peer
from broker.v1 import admin_pb2, admin_pb2_grpc

PEER_STATUS_TIMEOUT_S = 1.0


class PeerStatus:
    """``NodeStatus`` of other nodes; ``peer_channel`` opens a channel to a gRPC address (a TLS node
    gives a secure one: ``broker.security.node``)."""

    def __init__(self, peer_channel: Callable[[str], grpc.Channel] | None = None) -> None:
        self._peer_channel: Callable[[str], grpc.Channel] = peer_channel or grpc.insecure_channel
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="peer-status")

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = self._peer_channel(address)
            return channel

    def info(self, peer: Peer) -> admin_pb2.NodeInfo:
        """``peer``'s own status, or one marked unreachable (``reachable`` false)."""
        try:
            if not peer.grpc_address:
                raise LookupError(peer.node_id)
            return admin_pb2_grpc.AdminStub(self._channel(peer.grpc_address)).NodeStatus(
                admin_pb2.NodeStatusRequest(), timeout=PEER_STATUS_TIMEOUT_S)
        except (grpc.RpcError, LookupError):
            return admin_pb2.NodeInfo(id=peer.node_id, grpc_address=peer.grpc_address,
                                      raft_address=peer.raft_address, metrics_address=peer.metrics_address,
                                      role="unreachable", reachable=False)

    def infos(self, peers: Iterable[Peer]) -> list[admin_pb2.NodeInfo]:
        """:meth:`info` of each of ``peers``, asked in parallel, in their order."""
        return list(self._pool.map(self.info, peers))

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
