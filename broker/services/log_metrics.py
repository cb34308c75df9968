"""Prometheus collectors read at scrape time: records deleted by retention and prune, commands that
failed to apply, command formats, and routes (lag from the replicated cursors on every node;
copied/skipped counts of the leader's router)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.leader.route_admin import RouteAdmin
from broker.v1 import internal_pb2

# Every kind a failed apply can be counted under (broker/core/state_machine.py): the commands' kinds,
# "empty" (no body, or one only newer code knows) and "undecodable".
APPLY_FAILURE_KINDS: tuple[str, ...] = (
    *(f.name for f in internal_pb2.Command.DESCRIPTOR.oneofs_by_name["body"].fields), "empty", "undecodable")


class CountsCollector(Collector):
    """A counter family with one sample per key of ``counts()`` (read at scrape time), the key as
    the value of its one label."""

    def __init__(self, name: str, documentation: str, label: str, counts: Callable[[], Mapping[str, int]]) -> None:
        self._name, self._documentation, self._label, self._counts = name, documentation, label, counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=[self._label])
        for key, count in sorted(self._counts().items()):
            family.add_metric([key], count)
        yield family


def deletion_collector(deleted: Callable[[], Mapping[str, int]]) -> CountsCollector:
    """``raftbroker_records_deleted_total{reason="retention"|"prune"}`` applied by this node."""
    return CountsCollector("raftbroker_records_deleted", "Records deleted by retention caps and by prune/clear, "
                           "as applied by this node", "reason", deleted)


def apply_failure_collector(failed: Callable[[], Mapping[str, int]]) -> CountsCollector:
    """``raftbroker_apply_failures_total{command}``: commands this node recorded as failed at the
    apply wall since it started. Every node applies the same log, so every node should count the
    same; one that counts differently applies differently (mixed code in a rolling upgrade, or a
    bug) and its data has diverged (``docs/design/command-formats.md``).

    Every kind is exported from the start, at 0 until it fails: a series born at 1 has no earlier
    sample, so ``increase()`` (the RaftbrokerApplyFailed alert) saw no rise and a node's first
    failure never fired the alert."""
    def counts() -> dict[str, int]:
        return {**dict.fromkeys(APPLY_FAILURE_KINDS, 0), **failed()}

    return CountsCollector("raftbroker_apply_failures", "Committed commands this node recorded as failed at "
                           "the apply wall, by command kind", "command", counts)


class FormatCollector(Collector):
    """``raftbroker_command_format_applies`` (the newest command format this node's code applies)
    and ``raftbroker_command_format_cluster`` (the cluster's, as this node has applied it)."""

    def __init__(self, applies: int, cluster: Callable[[], int]) -> None:
        self._applies, self._cluster = applies, cluster

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("raftbroker_command_format_applies", "The newest command format this node's code "
                                "applies (docs/design/command-formats.md)", value=self._applies)
        yield GaugeMetricFamily("raftbroker_command_format_cluster", "The cluster's command format, as this node "
                                "has applied it", value=self._cluster())


class ReplicaCheckCollector(Collector):
    """``raftbroker_replicas_differing``: the nodes the leader's last comparison of apply digests
    named (``broker/leader/replica_check.py``); exported by the leader only."""

    def __init__(self, differing: Callable[[], int], is_leader: Callable[[], bool]) -> None:
        self._differing, self._is_leader = differing, is_leader

    def collect(self) -> Iterator[Metric]:
        if self._is_leader():
            yield GaugeMetricFamily("raftbroker_replicas_differing", "Nodes whose apply digest differed from the "
                                    "others' at the leader's last comparison (raftbroker cluster verify)",
                                    value=self._differing())


class RouteCollector(Collector):
    """Per route: lag (source records not routed yet) and the leader's copied/skipped counts."""

    def __init__(self, routes: RouteAdmin) -> None:
        self._routes = routes

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily("raftbroker_route_lag_records", "Source records a route has not routed yet",
                                labels=["route", "source", "target"])
        copied = CounterMetricFamily("raftbroker_route_copied_records", "Records copied by this node's router "
                                     "while it led", labels=["route"])
        lost = CounterMetricFamily("raftbroker_route_lost_records", "Records this node's router should have "
                                   "copied and could not (deleted before routed, unreadable, refused by the "
                                   "target)", labels=["route"])
        skipped = CounterMetricFamily("raftbroker_route_skipped_records", "Records this node's router did not "
                                      "copy (filter, op, echo, refused by the target)", labels=["route"])
        for info in self._routes.local_views():
            config = info.meta.config
            name = config.name
            lag.add_metric([name, config.source, config.target], info.lag)
            copied.add_metric([name], info.copied)
            skipped.add_metric([name], info.skipped)
            lost.add_metric([name], info.lost)
        yield lag
        yield copied
        yield skipped
        yield lost


class MemoryRefillCollector(Collector):
    """``raftbroker_memory_records_lost``: records of `memory` topics this node lost at its start and
    has not taken back from another node yet (broker/services/memory_refill.py); a rolling restart
    waits for 0 on a node before restarting the next. ``raftbroker_memory_records_refilled_total``:
    the records it took back since it started."""

    def __init__(self, lost: Callable[[], int], refilled: Callable[[], int]) -> None:
        self._lost, self._refilled = lost, refilled

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("raftbroker_memory_records_lost", "Records of memory topics this node lost at "
                                "its start and has not taken back from another node yet", value=self._lost())
        yield CounterMetricFamily("raftbroker_memory_records_refilled", "Records of memory topics this node "
                                  "took back from other nodes since it started", value=self._refilled())
