"""Leader-side route administration: validate, replicate, describe (SPEC §3.4).

Every input is checked before anything is submitted: names, that the source (and a local target)
exist and are stored topics, the CEL filter and partition-key expressions (compiled), the op list,
remote addresses, and that a local route does not close a cycle of routes (checked again when the
command is applied, so two concurrent creates cannot close one either).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker.clock import Clock
from broker.core.applied import Rejected
from broker.core.errors import InvalidArgument, RouteExists, RouteNotFound, TopicNotFound, shown
from broker.core.routes import RouteTable, cycle_error, find_cycle
from broker.core.state_machine import BrokerStateMachine
from broker.core.topics import NAME_RE, validate_name
from broker.leader.filters import RecordExpression, RecordFilter
from broker.leader.router import RouteRunner
from broker.leader.submitter import CommandSubmitter
from broker.v1 import internal_pb2, routes_internal_pb2

ROUTES_MAX = 1000
TARGET_ADDRESSES_MAX = 16


def _check_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"target_cluster address {shown(address)} is not host:port")
    return address


def _check_route_name(name: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(f"invalid route name {shown(name)}: use 1-249 characters of "
                              "A-Z a-z 0-9 . _ - starting with a letter or digit")


def _stored_topic(state: BrokerStateMachine, name: str, role: str) -> internal_pb2.TopicMeta:
    validate_name(name)
    meta = state.topic(name)
    if meta is None:
        raise TopicNotFound(name)
    if meta.config.durability == internal_pb2.DURABILITY_EPHEMERAL:
        raise InvalidArgument(f"{role} topic {name!r} is ephemeral: routes need stored topics")
    return meta


@dataclass
class RouteView:
    """A route as stored, with its cursors against the source's ends (``partitions``: partition,
    next offset, end offset) and this leader's live statistics (empty or 0 elsewhere)."""

    meta: routes_internal_pb2.RouteMeta
    partitions: list[tuple[int, int, int]] = field(default_factory=list)
    lag: int = 0
    last_error: str = ""
    copied: int = 0
    skipped: int = 0
    lost: int = 0


class RouteAdmin:
    """Create, list and delete routes; ``runner`` (this node's router) adds its live statistics."""

    def __init__(self, state: BrokerStateMachine, table: RouteTable, submitter: CommandSubmitter,
                 clock: Clock, runner: RouteRunner | None = None, *, cluster_id: str = "",
                 identify: Callable[[list[str]], str | None] | None = None) -> None:
        """``identify(addresses)``: the cluster id of the cluster at ``addresses``, or None when it
        cannot be asked now; with ``cluster_id`` (this cluster's), a route whose target cluster is
        this one is refused at create (it could only ever fail)."""
        self._state = state
        self._table = table
        self._submitter = submitter
        self._runner = runner
        self._clock = clock
        self._cluster_id = cluster_id
        self._identify = identify

    def normalized(self, config: internal_pb2.RouteConfig) -> internal_pb2.RouteConfig:
        """A validated copy of ``config``; raises the error a caller should see."""
        _check_route_name(config.name)
        out = internal_pb2.RouteConfig()
        out.CopyFrom(config)
        _stored_topic(self._state, config.source, "source")
        validate_name(config.target)
        if config.target_cluster:
            addresses = [a.strip() for a in config.target_cluster if a.strip()]
            if not 0 < len(addresses) <= TARGET_ADDRESSES_MAX:
                raise InvalidArgument(f"target_cluster needs 1 to {TARGET_ADDRESSES_MAX} addresses")
            del out.target_cluster[:]
            out.target_cluster.extend(dict.fromkeys(_check_address(a) for a in addresses))
        else:
            _stored_topic(self._state, config.target, "target")
        if config.filter:
            RecordFilter(config.filter)
        if config.partition_key:
            RecordExpression(config.partition_key, "partition_key")
        for op in config.ops:
            if op not in internal_pb2.Op.values():
                raise InvalidArgument(f"unknown op {op}")
        del out.ops[:]
        out.ops.extend(sorted(set(config.ops)))
        return out

    def create(self, config: internal_pb2.RouteConfig) -> RouteView:
        self._submitter.ensure_leader()
        config = self.normalized(config)
        existing = self._table.all()
        if any(m.config.name == config.name for m in existing):
            raise RouteExists(config.name)
        if len(existing) >= ROUTES_MAX:
            raise InvalidArgument(f"a cluster holds at most {ROUTES_MAX} routes")
        cycle = find_cycle((m.config for m in existing), config)
        if cycle is not None:
            raise cycle_error(config.name, cycle)
        # a target cluster that does not answer now is taken: the router checks again on every pass
        if (config.target_cluster and self._identify is not None and self._cluster_id
                and self._identify(list(config.target_cluster)) == self._cluster_id):
            raise InvalidArgument(f"target_cluster {shown(', '.join(config.target_cluster), quote=False)} is this "
                                  f"cluster ({self._cluster_id!r}): route to the topic here, without target_cluster")
        result = self._submitter.submit(internal_pb2.Command(create_route=routes_internal_pb2.CreateRouteCommand(
            config=config, now_ms=self._clock.now_ms())))
        if isinstance(result, Rejected):
            raise result.error
        assert isinstance(result, routes_internal_pb2.RouteMeta)
        if self._runner is not None:
            self._runner.wake()
        return self.info(result)

    def delete(self, name: str) -> None:
        _check_route_name(name)
        self._submitter.ensure_leader()
        meta = self._table.get(name)
        if meta is None:
            raise RouteNotFound(name)
        result = self._submitter.submit(internal_pb2.Command(delete_route=routes_internal_pb2.DeleteRouteCommand(
            name=name, route_id=meta.route_id)))
        if isinstance(result, Rejected):
            raise result.error

    def local_views(self) -> list[RouteView]:
        """Every route as this node's applied table and router have it, with this node's router's
        counts (its metrics: summed over nodes, each record counts once)."""
        return [self.info(meta, totals=False) for meta in self._table.all()]

    def list(self) -> list[RouteView]:
        """Every route, from the leader: its last error lives in the leader's router, and another node
        (one catching up after a restart, too) answered a stale table with it empty and nothing saying
        so; elsewhere NotLeader, which the SDKs follow. Copied, skipped and lost are the route's
        replicated totals (from command format 5; before it, the leader's since it took over)."""
        self._submitter.ensure_leader()
        return [self.info(meta) for meta in self._table.all()]

    def info(self, meta: routes_internal_pb2.RouteMeta, *, totals: bool = True) -> RouteView:
        info = RouteView(meta)
        for partition, next_offset, end_offset in self._table.positions(meta):
            info.partitions.append((partition, next_offset, end_offset))
            info.lag += max(0, end_offset - next_offset)
        stats = self._runner.stats.get(meta.config.name) if self._runner is not None else None
        if stats is not None and stats.route_id == meta.route_id:
            info.last_error, info.copied, info.skipped = stats.last_error, stats.copied, stats.skipped
            info.lost = stats.lost
        kept = self._table.totals(meta.config.name) if totals else None
        if kept is not None:  # replicated (command format 5): every leader's passes since the rise; this
            # leader's own count is larger while it has led since before the rise
            info.copied, info.skipped, info.lost = (max(a, b) for a, b in zip(kept, (info.copied, info.skipped,
                                                                                      info.lost), strict=True))
        return info
