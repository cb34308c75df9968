"""Prometheus metrics of one node (SPEC §8), served on the node's own metrics port.

Every family is listed and explained in ``docs/metrics.md``. Label values come from bounded sets
only: topic names of existing topics (series of a dropped topic are removed), status codes, Raft
roles and member addresses, the methods the gRPC server serves.

They are served by :class:`~broker.services.metrics_server.MetricsHttpServer` (its docstring says how
the port bounds what a caller can make the node hold), not by prometheus_client's
``start_http_server``, which gave every open connection a thread of its own for as long as it stayed
open.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from broker.replication import ReplicaStatus
from broker.replication.stats import RaftStats
from broker.services.binding import METRICS, BindFailed, describe
from broker.services.grpc_metrics import GrpcServerMetrics
from broker.services.metrics_server import DEFAULT_LIMITS, MetricsHttpLimits, MetricsHttpServer
from broker.services.raft_metrics import DiskCollector, RaftCollector, RaftStatsCollector

# No `x_created` series beside every counter and histogram: Prometheus 2.x ingests them as separate
# gauges (one more series per label set) and nothing here uses them.
disable_created_metrics()

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class NodeMetrics:
    """The metrics a node exports; one registry per node (tests run several in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_*: CPU, memory, open fds, start time
        PlatformCollector(registry=self.registry)  # python_info
        GCCollector(registry=self.registry)  # python_gc_*
        self.grpc = GrpcServerMetrics(self.registry)
        self.publish_records = Counter("raftbroker_publish_records", "Records acknowledged to publishers",
                                       ["topic"], registry=self.registry)
        self.publish_bytes = Counter("raftbroker_publish_bytes",
                                     "Bytes of the publish requests acknowledged to publishers (as received)",
                                     ["topic"], registry=self.registry)
        self.publish_errors = Counter("raftbroker_publish_errors", "Publish requests answered with an error",
                                      ["code"], registry=self.registry)
        self.publish_latency = Histogram("raftbroker_publish_latency_seconds",
                                         "Time from receiving a publish to acknowledging it",
                                         registry=self.registry, buckets=_LATENCY_BUCKETS)
        self.deliver_records = Counter("raftbroker_deliver_records", "Records delivered to subscribers",
                                       ["topic"], registry=self.registry)
        self.deliver_bytes = Counter("raftbroker_deliver_bytes",
                                     "Bytes of the responses that delivered records to subscribers (as sent)",
                                     ["topic"], registry=self.registry)
        self.subscribers = Gauge("raftbroker_subscribers", "Open subscription streams", registry=self.registry)
        self._published: dict[str, tuple[Counter, Counter]] = {}  # topic -> its series of publish_records, _bytes
        self._http: MetricsHttpServer | None = None

    def published(self, topic: str, records: int, request_bytes: int) -> None:
        """Count an acknowledged publish of ``records`` records in a request of ``request_bytes``:
        ``labels()`` looked up once per topic, not per request."""
        series = self._published.get(topic)
        if series is None:
            series = self._published[topic] = (self.publish_records.labels(topic), self.publish_bytes.labels(topic))
        series[0].inc(records)
        series[1].inc(request_bytes)

    def delivered(self, topic: str, records: int, response_bytes: int) -> None:
        """Count a response of ``response_bytes`` that delivered ``records`` records."""
        self.deliver_records.labels(topic).inc(records)
        self.deliver_bytes.labels(topic).inc(response_bytes)

    def forget_topic(self, topic: str) -> None:
        """Remove the series labelled with ``topic`` (after it was dropped), so a churn of topics
        does not grow the exposition without bound; a re-created topic starts from zero."""
        self._published.pop(topic, None)
        for metric in (self.publish_records, self.publish_bytes, self.deliver_records, self.deliver_bytes):
            metric.remove(topic)  # a no-op when there is no such series

    def watch_replica(self, status: Callable[[], ReplicaStatus], store_size: Callable[[], int],
                      stats: Callable[[], RaftStats] | None = None, data_dir: Path | None = None) -> None:
        """Export the replica's status and store size; with ``stats``, elections, leader changes,
        follower lag, fsync and snapshot latencies; with ``data_dir``, its file system's free space."""
        self.registry.register(RaftCollector(status, store_size))
        if stats is not None:
            self.registry.register(RaftStatsCollector(stats))
        if data_dir is not None:
            self.registry.register(DiskCollector(data_dir))

    def serve(self, host: str, port: int, limits: MetricsHttpLimits = DEFAULT_LIMITS) -> int:
        """Serve ``/metrics`` on ``host:port`` (0: a port the kernel picks); return the port bound.
        Raises :class:`~broker.services.binding.BindFailed` when the address cannot be bound."""
        assert self._http is None, "serve() may be called once"
        try:
            server = MetricsHttpServer(host, port, self.registry, limits)
        except OSError as exc:
            raise BindFailed(METRICS, f"{host}:{port}", describe(exc)) from exc
        server.start()
        self._http = server
        return server.port

    def close(self) -> None:
        """Stop serving: the port is freed and the server's threads end (they hold the registry, and
        through the collectors the whole node, gRPC server included, for as long as they run)."""
        if self._http is None:
            return
        server, self._http = self._http, None
        server.close()
