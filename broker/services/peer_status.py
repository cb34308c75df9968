"""Asking other nodes for their ``NodeStatus`` and ``ApplyDigest`` over gRPC: ``ClusterStatus`` gathers
every member's view with it, the leader reads the members' command formats with it
(``broker/leader/formats``), and ``VerifyReplicas`` compares the members' apply digests at one index
(:meth:`PeerStatus.verify`). A channel per address is kept open; a node that does not answer within
:data:`PEER_STATUS_TIMEOUT_S` is reported unreachable."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.core import apply_digest
from broker.core.errors import BrokerError, NotFound
from broker.core.members import Peer
from broker.v1 import admin_pb2, admin_pb2_grpc

PEER_STATUS_TIMEOUT_S = 1.0
# a kept channel to a node that was down retries at most every second: at gRPC's default backoff (up
# to 120 s) a restarted node that served again within 3 s was reported unreachable for up to a minute,
# and `cluster verify` failed meanwhile (the client SDK's channels use the same bound)
PEER_CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                        ("grpc.max_reconnect_backoff_ms", 1000))
VERIFY_ATTEMPTS = 5  # a node may move past the kept digests between the status and the digest asked

LocalDigest = Callable[[int], tuple[int, int]]  # index -> (digest, started index); raises a BrokerError


class _Gone(Exception):
    """A node no longer keeps the digest at the index asked: ask all again at a newer one."""


class PeerStatus:
    """``NodeStatus`` of other nodes; ``peer_channel`` opens a channel to a gRPC address (a TLS node
    gives a secure one: ``broker.security.node``)."""

    def __init__(self, peer_channel: Callable[..., grpc.Channel] | None = None) -> None:
        """``peer_channel(address, options=...)`` opens a channel (default: plaintext)."""
        self._peer_channel: Callable[..., grpc.Channel] = peer_channel or grpc.insecure_channel
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="peer-status")

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = self._peer_channel(address, options=PEER_CHANNEL_OPTIONS)
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

    def serving(self, peer: Peer) -> bool:
        """Whether ``peer`` answers gRPC health SERVING (``services/health.py``: a member with a
        leader, caught up, holding what it lost of `memory` topics) within the status timeout."""
        if not peer.grpc_address:
            return False
        try:
            reply = health_pb2_grpc.HealthStub(self._channel(peer.grpc_address)).Check(
                health_pb2.HealthCheckRequest(), timeout=PEER_STATUS_TIMEOUT_S)
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def serving_each(self, peers: Iterable[Peer]) -> list[bool]:
        """:meth:`serving` of each of ``peers``, asked in parallel, in their order."""
        return list(self._pool.map(self.serving, peers))

    def info_fresh(self, peer: Peer) -> admin_pb2.NodeInfo | None:
        """``peer``'s own status over a channel of its own, closed after (None: no answer). For a node
        that may be starting: a kept channel would wait out its reconnect backoff before trying again."""
        channel = self._peer_channel(peer.grpc_address)
        try:
            return admin_pb2_grpc.AdminStub(channel).NodeStatus(admin_pb2.NodeStatusRequest(),
                                                                 timeout=PEER_STATUS_TIMEOUT_S)
        except grpc.RpcError:
            return None
        finally:
            channel.close()

    def infos(self, peers: Iterable[Peer]) -> list[admin_pb2.NodeInfo]:
        """:meth:`info` of each of ``peers``, asked in parallel, in their order."""
        return list(self._pool.map(self.info, peers))

    def digest(self, peer: Peer, index: int) -> admin_pb2.NodeDigest:
        """``peer``'s apply digest at ``index`` (``error`` set when it gives none); raises :class:`_Gone`
        when it no longer keeps that index."""
        try:
            answer = admin_pb2_grpc.AdminStub(self._channel(peer.grpc_address)).ApplyDigest(
                admin_pb2.ApplyDigestRequest(index=index), timeout=PEER_STATUS_TIMEOUT_S)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else None
            if code == grpc.StatusCode.NOT_FOUND:
                raise _Gone(peer.node_id) from None
            if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                detail = err.details() if isinstance(err, grpc.Call) else str(err)
                return admin_pb2.NodeDigest(id=peer.node_id, reachable=True, error=detail or code.name)
            return admin_pb2.NodeDigest(id=peer.node_id, reachable=False, error="did not answer")
        return admin_pb2.NodeDigest(id=peer.node_id, reachable=True, digest=answer.digest)

    def verify(self, me: Callable[[], admin_pb2.NodeInfo], local: LocalDigest,
               peers: list[Peer]) -> admin_pb2.VerifyReplicasResponse:
        """Every member's apply digest at the lowest index all reachable members have applied
        (``me()``: this node's status; ``local``: its digest at an index; ``peers``: the others)."""
        for _ in range(VERIFY_ATTEMPTS):
            members: list[tuple[admin_pb2.NodeInfo, Peer | None]] = [
                (me(), None), *zip(self.infos(peers), peers, strict=True)]
            members.sort(key=lambda m: m[0].id)
            index = min(info.applied_index for info, _ in members if info.reachable)
            try:
                found = list(self._pool.map(functools.partial(self._digest_of, index=index, local=local), members))
            except _Gone:
                continue
            digests = {d.id: d.digest for d in found if d.reachable and not d.error}
            differ = apply_digest.differing(digests)
            return admin_pb2.VerifyReplicasResponse(
                index=index, nodes=found, differing=differ,
                agreed=not differ and len(digests) == len(found))
        raise NotFound(f"could not compare the members at one index ({VERIFY_ATTEMPTS} attempts): a member is more "
                       f"than {apply_digest.RECENT_MAX} entries behind the others (raftbroker cluster status), or "
                       "they applied past the digests they keep while asked; ask again once it has caught up")

    def _digest_of(self, member: tuple[admin_pb2.NodeInfo, Peer | None], index: int,
                   local: LocalDigest) -> admin_pb2.NodeDigest:
        """One member's digest at ``index`` (its status and its peer entry; no peer entry: this node)."""
        info, peer = member
        if not info.reachable:
            return admin_pb2.NodeDigest(id=info.id, reachable=False, error="did not answer")
        if peer is not None:
            return self.digest(peer, index)
        try:
            value, _ = local(index)
        except NotFound:
            raise _Gone(info.id) from None
        except BrokerError as err:
            return admin_pb2.NodeDigest(id=info.id, reachable=True, error=str(err))
        return admin_pb2.NodeDigest(id=info.id, reachable=True, digest=value)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
