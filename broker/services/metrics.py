"""Prometheus metrics of one node (SPEC §8), served on the node's own metrics port."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.replication import ReplicaStatus, Role

_LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class _RaftCollector(Collector):
    """Reads the replicator's status at scrape time (never stale, no background thread)."""

    def __init__(self, status: Callable[[], ReplicaStatus], store_size: Callable[[], int]) -> None:
        self._status = status
        self._store_size = store_size

    def collect(self) -> Iterator[GaugeMetricFamily]:
        st = self._status()
        role = GaugeMetricFamily("raftbroker_raft_role", "1 for this node's current Raft role", labels=["role"])
        for r in Role:
            role.add_metric([r.value], 1.0 if st.role == r else 0.0)
        yield role
        yield GaugeMetricFamily("raftbroker_raft_term", "Current Raft term", value=st.term)
        yield GaugeMetricFamily("raftbroker_raft_commit_index", "Raft commit index", value=st.commit_index)
        yield GaugeMetricFamily("raftbroker_raft_applied_index", "Raft index applied to the store",
                                value=st.applied_index)
        yield GaugeMetricFamily("raftbroker_raft_has_quorum", "1 when this node is a leader with a quorum",
                                value=1.0 if st.has_quorum else 0.0)
        yield GaugeMetricFamily("raftbroker_store_size_bytes", "Approximate size of the local store",
                                value=self._store_size())


class NodeMetrics:
    """The metrics a node exports; one registry per node (tests run several in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.publish_records = Counter("raftbroker_publish_records", "Records acknowledged to publishers",
                                       ["topic"], registry=self.registry)
        self.publish_bytes = Counter("raftbroker_publish_bytes", "Value bytes acknowledged to publishers",
                                     ["topic"], registry=self.registry)
        self.publish_errors = Counter("raftbroker_publish_errors", "Publish requests answered with an error",
                                      ["code"], registry=self.registry)
        self.publish_latency = Histogram("raftbroker_publish_latency_seconds",
                                         "Time from receiving a publish to acknowledging it",
                                         registry=self.registry, buckets=_LATENCY_BUCKETS)
        self.deliver_records = Counter("raftbroker_deliver_records", "Records delivered to subscribers",
                                       ["topic"], registry=self.registry)
        self.subscribers = Gauge("raftbroker_subscribers", "Open subscription streams", registry=self.registry)

    def forget_topic(self, topic: str) -> None:
        """Remove the series labelled with ``topic`` (after it was dropped), so a churn of topics
        does not grow the exposition without bound; a re-created topic starts from zero."""
        for metric in (self.publish_records, self.publish_bytes, self.deliver_records):
            metric.remove(topic)

    def watch_replica(self, status: Callable[[], ReplicaStatus], store_size: Callable[[], int]) -> None:
        self.registry.register(_RaftCollector(status, store_size))

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
