"""``broker.v1.Broker``: publish and subscribe, delegated to ``broker.core``."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc

from broker.core.errors import BrokerError
from broker.core.reading import Reader
from broker.core.topic_log import TopicLog
from broker.services import errors
from broker.services.group_service import GroupBrokerMethods
from broker.services.metrics import NodeMetrics
from broker.v1 import broker_pb2, broker_pb2_grpc


class BrokerServicer(GroupBrokerMethods, broker_pb2_grpc.BrokerServicer):
    """Data plane (consumer-group RPCs: :class:`GroupBrokerMethods`)."""

    def __init__(self, log: TopicLog, reader: Reader, metrics: NodeMetrics) -> None:
        self._log = log
        self._reader = reader
        self._metrics = metrics

    def _publish(self, request: broker_pb2.PublishRequest) -> broker_pb2.PublishResponse:
        started = time.perf_counter()
        try:
            response = self._log.publish(request)
        except BrokerError as exc:
            self._metrics.publish_errors.labels(errors.status_code(exc).name).inc()
            raise
        self._metrics.publish_latency.observe(time.perf_counter() - started)
        self._metrics.publish_records.labels(request.topic).inc(len(request.records))
        self._metrics.publish_bytes.labels(request.topic).inc(sum(len(r.value) for r in request.records))
        return response

    @errors.unary
    def Publish(self, request: broker_pb2.PublishRequest, context: grpc.ServicerContext) -> broker_pb2.PublishResponse:
        return self._publish(request)

    @errors.streaming
    def PublishStream(self, request_iterator: Iterator[broker_pb2.PublishRequest],
                      context: grpc.ServicerContext) -> Iterator[broker_pb2.PublishResponse]:
        for request in request_iterator:
            yield self._publish(request)

    @errors.streaming
    def Subscribe(self, request: broker_pb2.SubscribeRequest,
                  context: grpc.ServicerContext) -> Iterator[broker_pb2.SubscribeResponse]:
        if request.group:
            stream = self.group_subscribe(request, context.is_active)
        else:
            stream = self._reader.subscribe(request, context.is_active)
        delivered = self._metrics.deliver_records.labels(request.topic)
        self._metrics.subscribers.inc()
        try:
            for item in stream:
                if item.HasField("batch"):
                    delivered.inc(len(item.batch.records))
                yield item
        finally:
            self._metrics.subscribers.dec()
