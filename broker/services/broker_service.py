"""``broker.v1.Broker``: publish and subscribe, delegated to ``broker.core``.

``Publish`` and ``PublishStream`` are coroutines on the asyncio server: a publish is prepared on the
event loop (on the call pool for topics with a schema or dedup fields) and awaits its commit without
a thread. The other unary methods are sync (they run on the server's call pool); the other
streaming methods are coroutines that hold no thread while they wait (``broker.services.streams``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator

import grpc

from broker.core.errors import BrokerError
from broker.leader.groups.delivery import GroupDelivery
from broker.leader.groups.service import GroupService
from broker.leader.packed_reads import PackedBatch
from broker.leader.reading import Idle, Reader
from broker.leader.topic_log import TopicLog
from broker.protowire import Received, receiving
from broker.security import current_principal, stream_check
from broker.services import errors, wire
from broker.services.group_service import GroupBrokerMethods
from broker.services.metrics import NodeMetrics
from broker.services.streams import StreamRuntime, small_response
from broker.v1 import broker_pb2, broker_pb2_grpc


class BrokerServicer(GroupBrokerMethods, broker_pb2_grpc.BrokerServicer):
    """Data plane (consumer-group RPCs: :class:`GroupBrokerMethods`)."""

    def __init__(self, log: TopicLog, reader: Reader, metrics: NodeMetrics, streams: StreamRuntime, *,
                 groups: GroupService, group_delivery: GroupDelivery) -> None:
        self._log = log
        self._groups = groups
        self._group_delivery = group_delivery
        self._reader = reader
        self._metrics = metrics
        self._streams = streams

    async def _publish(self, received: Received[broker_pb2.PublishRequest],
                       producer: str) -> broker_pb2.PublishResponse:
        """One publish on the event loop: prepared here (on the call pool for topics that check
        records against a schema or dedup fields), submitted, and answered once applied, with no
        thread waiting for the commit."""
        started = time.perf_counter()
        request = received.message
        try:
            batch = wire.publish_batch(request, received.data)
            published = await self._log.publish_placed_async(batch, producer, offload=self._streams.call)
            response = wire.publish_response(published, request)
        except BrokerError as exc:
            self._metrics.publish_errors.labels(errors.status_code(exc).name).inc()
            raise
        self._metrics.publish_latency.observe(time.perf_counter() - started)
        self._metrics.published(request.topic, batch.count, len(received.data))
        return response

    @errors.unary_async
    async def Publish(self, request: Received[broker_pb2.PublishRequest],
                      context: grpc.aio.ServicerContext) -> broker_pb2.PublishResponse:
        """``request`` comes with its bytes (``add_broker_service``): the packed form's check reads them."""
        return await self._publish(request, current_principal())  # set by the auth interceptor in this task

    @errors.streaming_async
    async def PublishStream(self, request_iterator: AsyncIterator[Received[broker_pb2.PublishRequest]],
                            context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[broker_pb2.PublishResponse]:
        """One request at a time, in order (no pipelining: request N+1 must not commit after N
        failed, or a client's per-record msg_id watermark would skip N's records on retry)."""
        self._streams.admit()
        producer = current_principal()  # set by the auth interceptor in this call's task
        try:
            async for request in request_iterator:
                yield await self._publish(request, producer)
        finally:
            self._streams.release()

    @errors.streaming_async
    async def Subscribe(self, request: broker_pb2.SubscribeRequest,
                        context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[broker_pb2.SubscribeResponse | bytes]:
        """Stored records come serialized (``PackedBatch``), sent as they are (``add_broker_service``)."""
        subscription = wire.subscription(request)
        allowed = stream_check()  # the caller's credentials and grant, checked again (security on)

        def open_steps(is_active: Callable[[], bool]
                       ) -> Iterator[broker_pb2.SubscribeResponse | PackedBatch | Idle]:
            if subscription.group:
                # before each pick: a stream whose caller was cut off ends before it leases anything more
                active = is_active if allowed is None else (lambda: is_active() and allowed())
                return wire.public_steps(self.group_subscribe(subscription, active))
            return wire.public_steps(self._reader.subscribe_steps(subscription, is_active, packed=True))

        # series are made at the first batch: a topic that does not exist (yet) gets none
        self._metrics.subscribers.inc()
        try:
            stateless = not subscription.group
            tail = small_response if stateless and not subscription.filter else None
            async for item in self._streams.serve(open_steps, read_ahead=stateless, tail_on_loop=tail):
                if isinstance(item, PackedBatch):
                    self._metrics.delivered(request.topic, item.records, len(item.data))
                    yield item.data
                    continue
                assert isinstance(item, broker_pb2.SubscribeResponse)
                if item.HasField("batch") and item.batch.records:
                    data = item.SerializeToString()  # as the response serializer would, once
                    self._metrics.delivered(request.topic, len(item.batch.records), len(data))
                    yield data
                    continue
                yield item
        finally:
            self._metrics.subscribers.dec()


_RECEIVE_PUBLISH = receiving(broker_pb2.PublishRequest.FromString)


def _subscribe_bytes(response: broker_pb2.SubscribeResponse | bytes) -> bytes:
    """``Subscribe``'s response serializer: a message, or a response serialized already."""
    return response if isinstance(response, bytes) else response.SerializeToString()


class _Registration:
    """What a generated ``add_*Servicer_to_server`` hands a server, kept to be changed first."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # rebuilt from ``handlers`` by add_broker_service

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers = dict(handlers)


def add_broker_service(servicer: BrokerServicer, server: grpc.aio.Server) -> None:
    """Register ``broker.v1.Broker`` as the generated code does, with ``Subscribe`` also sending
    responses that are bytes already, and ``Publish`` and ``PublishStream`` handing the servicer each
request with its bytes (every other method unchanged)."""
    registration = _Registration()
    broker_pb2_grpc.add_BrokerServicer_to_server(servicer, registration)
    handlers = registration.handlers
    handlers["Subscribe"] = handlers["Subscribe"]._replace(response_serializer=_subscribe_bytes)
    for method in ("Publish", "PublishStream"):  # requests kept with their bytes
        handlers[method] = handlers[method]._replace(request_deserializer=_RECEIVE_PUBLISH)
    name = broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)
