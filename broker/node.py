"""One broker node: store, state machine, replicator, core, gRPC server and metrics, wired together.

Built in one pass (:class:`Node`'s constructor): store, state machine and appliers, replicator,
leader services, servicers (each given everything it delegates to), server.

Start order: the store and state machine are opened before the replicator (pysyncobj may restore
a snapshot into them at once), then the replicator, then the metrics and gRPC servers. Stop order
is the reverse; a SIGTERM or SIGINT stops the node gracefully (streams are given time to drain).
"""

from __future__ import annotations

import functools
import logging
import shutil
import signal
import threading
import time
from types import FrameType

import grpc

from broker import data_dir, node_groups
from broker.clock import NodeClock
from broker.config import NodeConfig
from broker.core import formats
from broker.core.errors import Unavailable
from broker.core.members import MemberRegistry, Peer
from broker.core.retention import Retention
from broker.core.routes import RouteTable
from broker.core.state_machine import BrokerStateMachine
from broker.leader import filters
from broker.leader.changes import Changes
from broker.leader.ephemeral import EphemeralHub
from broker.leader.formats import FormatRaiser
from broker.leader.housekeeping import Housekeeper
from broker.leader.membership import MembershipChanges, NodeAnswer
from broker.leader.reading import RESPONSE_BYTES_MAX, Reader
from broker.leader.replica_check import ReplicaCheck
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.node_groups import NodeGroups
from broker.node_routes import NodeRoutes
from broker.replication import Role
from broker.replication.raft import PysyncobjReplicator, RaftOptions, Restore, simulate_power_loss_from_env
from broker.security.node import route_security, server_security
from broker.services.admin_service import AdminServicer
from broker.services.binding import METRICS, check_free
from broker.services.broker_service import BrokerServicer
from broker.services.health import replica_health
from broker.services.log_metrics import (
    FormatCollector,
    MemoryRefillCollector,
    ReplicaCheckCollector,
    apply_failure_collector,
    deletion_collector,
)
from broker.services.memory_refill import CAMPAIGN_DEFERRAL_S_MAX, MemoryRefill, period_from_env
from broker.services.metrics import NodeMetrics
from broker.services.peer_status import PeerStatus
from broker.services.server import GrpcServer
from broker.services.streams import StreamRuntime
from broker.storage.rocks import RocksStore

log = logging.getLogger(__name__)

GRACE_S = 3.0
TRANSFER_WAIT_S = 2.0
_MESSAGE_SLACK_BYTES = 1 << 20
# per-record framing inside a command (length prefixes, partition numbers) on top of the bodies
_COMMAND_OVERHEAD_BYTES = 1 << 20


def raft_options(config: NodeConfig) -> RaftOptions:
    """The replication layer's options from the node's settings (each ``raft_*`` setting to its option)."""
    return RaftOptions(password=config.raft_secret(), password_salt=config.raft_salt(),
                       max_command_bytes=config.max_batch_bytes + _COMMAND_OVERHEAD_BYTES,
                       compaction_min_entries=config.raft_compaction_min_entries,
                       compaction_min_time_s=config.raft_compaction_min_time_s,
                       journal_segment_bytes=config.raft_journal_segment_bytes,
                       journal_cache_bytes=config.raft_journal_cache_bytes,
                       journal_direct_write_min_bytes=config.raft_journal_direct_write_min_bytes,
                       raft_min_timeout_s=config.raft_election_timeout_min_s,
                       raft_max_timeout_s=config.raft_election_timeout_max_s,
                       leader_fallback_timeout_s=config.raft_leader_fallback_timeout_s,
                       connection_timeout_s=config.raft_connection_timeout_s,
                       connection_retry_s=config.raft_connection_retry_s)


class Node:
    """A running node; :meth:`close` releases everything it opened."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        me = Peer(config.node_id, config.raft_address, config.grpc_address, config.metrics_address)
        peers = PeerDirectory([me, *(Peer(p.id, p.raft_address, p.grpc_address, p.metrics_address)
                                     for p in config.peers)])
        data_dir.check_writable(config.data_dir)  # then make sure it is this node's (broker/data_dir.py)
        data_dir.claim(config.data_dir, data_dir.Identity(config.cluster_id, config.node_id),
                       adopt=config.adopt_data_dir, alone=not config.peers)
        if simulate_power_loss_from_env():  # tests: RocksDB is written without fsync, so a power
            # loss may take any of it; rebuild from the fsynced snapshot and journal, as after one
            shutil.rmtree(config.data_dir / "store", ignore_errors=True)
        # wall time of every command's now_ms and of the broker's own leases and windows (drills shift it)
        self.clock = NodeClock.from_env()
        self.clock.start()  # a test hook's file is followed from here on (no-op in production)
        # 1. store, state machine and every applier (registered before the replicator applies anything)
        self.store = RocksStore(config.data_dir / "store", direct_writes=config.store_direct_writes,
                                compression=config.store_compression, drop_behind=config.store_drop_behind)
        # journaled: applies are written without RocksDB's WAL, the Raft journal is the WAL (docs/design/log.md)
        self.state = BrokerStateMachine(self.store, Changes(), journaled=True, exclusive=threading.Lock())
        formats.check_data(self.state.cluster_format)  # a downgrade past the cluster's format: refuse
        self.retention = Retention(self.state)
        self.member_registry = MemberRegistry(self.state)  # members added at run time
        group_applier = node_groups.group_applier(self.state, self.retention)  # consumer groups
        route_table = RouteTable(self.state)  # routes
        # 2. the replicator
        if (config.raft_password or config.raft_password_file) and not config.raft_password_salt:
            log.warning("raft_password_salt is not set: the Raft password's salt is derived from cluster_id; "
                        "set a random one (the same on every node)")
        options = raft_options(config)
        restore = None
        if not config.peers and data_dir.restoring(config.data_dir):  # an adopted copy (broker/data_dir.py)
            restore = Restore(functools.partial(data_dir.restore_history_end, config.data_dir),
                              functools.partial(data_dir.restored, config.data_dir))
        self.replicator = PysyncobjReplicator(config.raft_address, [p.raft_address for p in config.peers],
                                              config.data_dir / "raft", self.state, options, restore)
        # 3. the leader services (and the metrics they report to)
        self.metrics = NodeMetrics()
        self.state.add_drop_listener(self.metrics.forget_topic)  # no series of dropped topics stay
        self.metrics.watch_replica(self.replicator.status, self.store.size_bytes, stats=self.replicator.stats,
                                   data_dir=config.data_dir)
        self.metrics.registry.register(deletion_collector(lambda: self.retention.deleted_records))
        self.metrics.registry.register(apply_failure_collector(lambda: self.state.failed_applies))
        self.metrics.registry.register(FormatCollector(formats.APPLY_FORMAT, lambda: self.state.cluster_format))
        submitter = CommandSubmitter(self.replicator, peers, config.commit_timeout_ms / 1000)
        limits = Limits(record_bytes_max=config.max_record_bytes, batch_bytes_max=config.max_batch_bytes,
                        memory_topics_bytes_max=config.max_memory_topics_bytes, topics_max=config.max_topics)
        hub = EphemeralHub(self.state.notify_change, bytes_max=config.max_ephemeral_bytes)
        self.topic_log = TopicLog(self.state, submitter, limits, origin=f"{config.cluster_id}/{config.node_id}",
                                  clock=self.clock, hub=hub)
        is_leader = self._is_leader
        security = server_security(config)  # TLS and authentication (None: plaintext, no auth)
        peers.attach(self.member_registry, self.replicator.members)
        self.peer_status = peer_status = PeerStatus(security.peer_channel if security is not None else None)
        self.peers = peers
        self.format_raiser = FormatRaiser(lambda: self.state.cluster_format, peers.all,
                                          lambda others: _apply_formats(peer_status, others), submitter,
                                          self_id=config.node_id, hold=config.hold_command_format)
        self.replica_check = ReplicaCheck(lambda: _compare_replicas(self.admin),
                                          config.verify_replicas_period_ms / 1000)
        self.metrics.registry.register(ReplicaCheckCollector(lambda: len(self.replica_check.differing), is_leader))
        self.housekeeper = Housekeeper([self.topic_log.expire_dedup, self.topic_log.enforce_retention,
                                        self.format_raiser.raise_if_ready, self.replica_check.check_if_due],
                                       is_leader, config.housekeeping_period_ms / 1000,
                                       on_lead=[self.replica_check.make_due],
                                       on_step_down=[hub.let_go])
        # every node takes back from the others the `memory` records it lost at its start
        self.memory_refill = MemoryRefill(
            self.state, lambda: [p.grpc_address for p in peers.others(config.node_id) if p.grpc_address],
            security.peer_channel if security is not None else grpc.insecure_channel, period_from_env())
        # a follower still taking them back lets the others campaign first (it would serve its groups a
        # skip over records they hold), for a few seconds at most: never a leaderless cluster for long
        self.replicator.defer_campaigns(self.memory_refill.unasked, CAMPAIGN_DEFERRAL_S_MAX)
        self.metrics.registry.register(MemoryRefillCollector(
            self.state.lost_records,
            lambda: self.state.refilled_records))
        membership = MembershipChanges(self.member_registry, self.replicator, self.replicator, submitter, peers,
                                       config.commit_timeout_ms / 1000, lambda peer: _answer(peer_status, peer))
        self.groups = NodeGroups(self.state, group_applier, submitter=submitter, metrics=self.metrics,
                                 topics_max=config.max_topics,
                                 clock=self.clock, response_bytes_max=self.response_bytes_max,
                                 held=self.memory_refill.held)
        self.routes = NodeRoutes(self.state, route_table, cluster_id=config.cluster_id, node_id=config.node_id,
                                 submitter=submitter, limits=limits, is_leader=self._leads_ready, metrics=self.metrics,
                                 clock=self.clock, remote_security=route_security(config),
                                 held=self.memory_refill.held)
        reader = Reader(self.state, hub, submitter.ensure_leader, self.require_serving,
                        response_bytes_max=self.response_bytes_max, leader_term=submitter.leader_term)
        self.streams = StreamRuntime(self.state, streams_max=config.max_streams)
        # 4. the servicers, with everything they delegate to, and 5. the server
        broker = BrokerServicer(self.topic_log, reader, self.metrics, self.streams, groups=self.groups.service,
                                group_delivery=self.groups.delivery)
        self.admin = AdminServicer(self.topic_log, self.replicator, me, peers, membership=membership,
                                   group_ops=self.groups.operations, route_admin=self.routes.admin,
                                   peer_status=peer_status, cluster_format=lambda: self.state.cluster_format,
                                   digests=lambda: self.state.digests)
        self.server = GrpcServer(config.grpc_address, broker, self.admin, self.max_message_bytes, self.streams,
                                 health_check=lambda: replica_health(self.replicator, self.memory_refill.pending),
                                 extra=[self.routes.mirror_service()],
                                 interceptors=[self.metrics.grpc.aio_interceptor()], security=security)

    def _is_leader(self) -> bool:
        return self.replicator.status().role == Role.LEADER

    def _leads_ready(self) -> bool:
        """Leads, and has applied what was committed before its term: a router that started sooner
        read the cursors from before the last leader's advances, copied again what it had copied
        (stored once, by the copies' idempotency keys) and counted it again."""
        status = self.replicator.status()
        return status.role == Role.LEADER and status.leader_ready

    @property
    def max_message_bytes(self) -> int:
        """The gRPC message limit, both ways: a full publish batch plus framing."""
        return self.config.max_batch_bytes + _MESSAGE_SLACK_BYTES

    @property
    def response_bytes_max(self) -> int:
        """Byte bound of the records in one stream response: :data:`RESPONSE_BYTES_MAX`, lower when
        the message limit is small (a lone record of up to ``max_record_bytes`` is always sent; the
        slack of 1 MiB covers its metadata)."""
        return min(RESPONSE_BYTES_MAX, self.config.max_batch_bytes)

    def require_serving(self) -> None:
        """Raise :class:`Unavailable` when this node's Raft has halted: its state is stale for good."""
        failure = self.replicator.failure
        if failure is not None:
            raise Unavailable(f"this node's Raft has halted ({type(failure).__name__}: {failure}); its data may "
                              "be stale: read from another node, and repair or wipe this node's data directory")

    def start(self) -> None:
        # gRPC bound its port as the node was built; the metrics port is checked here, before Raft starts,
        # so a node that stops for a taken port has not taken part in an election on its way out
        check_free(METRICS, self.config.metrics_address)
        self.replicator.start()
        host, _, port = self.config.metrics_address.rpartition(":")
        self.metrics.serve(host, int(port))
        self.server.start()
        self.housekeeper.start()
        self.groups.start()
        self.routes.start()
        self.memory_refill.start()
        filters.preload()  # the CEL library, off the start's path (its first filter then waits for nothing)
        log.info("node %s serving gRPC on %s (raft %s, metrics %s)", self.config.node_id,
                 self.config.grpc_address, self.config.raft_address, self.config.metrics_address)

    def close(self) -> None:
        self.memory_refill.stop()
        self.housekeeper.stop()
        self.groups.stop()
        self.routes.stop()
        self._hand_over_leadership()
        self.server.stop(GRACE_S)
        self.metrics.close()
        self.admin.close()
        self.replicator.close()
        self.store.close()
        self.clock.stop()


    def _ready_successor(self) -> str | None:
        """The Raft address of a follower that is ready (gRPC health SERVING) when some others are
        not, else None (the most caught-up one). A follower still taking back the `memory` records
        it lost at its restart is not ready: handed the leadership, it served its groups a skip over
        records the others held (found by an audit)."""
        others = [p for p in self.peers.others(self.config.node_id) if p.raft_address]
        ready = [p for p, serving in zip(others, self.peer_status.serving_each(others), strict=True) if serving]
        return ready[0].raft_address if ready and len(ready) < len(others) else None

    def _hand_over_leadership(self) -> None:
        """A leader that stops gracefully hands over first, so writers wait milliseconds, not an
        election timeout."""
        if self.replicator.status().role != Role.LEADER:
            return
        successor = self._ready_successor()
        if not self.replicator.transfer_leadership(successor) and (
                successor is None or not self.replicator.transfer_leadership()):  # not connected: any other
            log.info("no caught-up follower to hand leadership to; stopping as leader")
            return
        deadline = time.monotonic() + TRANSFER_WAIT_S
        while time.monotonic() < deadline and self.replicator.status().role == Role.LEADER:
            time.sleep(0.01)
        log.info("handed leadership over (now %s)", self.replicator.status().role.value)


def _answer(peer_status: PeerStatus, peer: Peer) -> NodeAnswer | None:
    """What the node at ``peer``'s gRPC address says of itself (None: nothing answered)."""
    info = peer_status.info_fresh(peer)
    return NodeAnswer(info.id, info.raft_address) if info is not None else None


def _apply_formats(peer_status: PeerStatus, peers: list[Peer]) -> list[int | None]:
    """The newest command format each of ``peers``' code applies, None for one that does not answer."""
    return [info.apply_format if info.reachable else None for info in peer_status.infos(peers)]


def _compare_replicas(admin: AdminServicer) -> tuple[int, tuple[str, ...]]:
    """(index compared, nodes whose apply digest differs there): ``VerifyReplicas`` in plain types."""
    found = admin.verify_replicas()
    return found.index, tuple(found.differing)


SIGNAL_POLL_S = 0.2


def serve(config: NodeConfig) -> None:
    """Run a node until SIGTERM or SIGINT.

    The main thread sleeps in short steps rather than blocking on a lock: Python runs a signal's
    handler only on the main thread, between bytecodes, and a SIGTERM that the kernel delivers to
    one of the node's other threads does not wake a main thread blocked without a timeout (seen
    once under load: the node kept running until killed, its store unflushed). The handler only
    sets a flag: taking a lock there could deadlock against the main thread holding it."""
    signals: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    node = Node(config)
    node.start()
    print(f"node {config.node_id} ready on {config.grpc_address}", flush=True)
    while not signals:
        time.sleep(SIGNAL_POLL_S)
    log.info("node %s stopping (%s)", config.node_id, signal.Signals(signals[0]).name)
    node.close()
