"""An in-process gRPC node with scripted behaviour, for SDK tests that need exact failures.

Not a broker: it answers from a script (redirect to a leader, refuse without a leader a number
of times, break a Subscribe stream after N records, apply a publish and then drop the answer)
and records what it was asked. Like the broker, it stores a record whose idempotency key it has
seen (in this fake: ever) only once and answers the first copy's place with ``duplicate``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from broker.core.errors import TopicExists, TopicNotFound
from broker.core.records import PositionToken
from broker.services.errors import abort
from broker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, common_pb2


@dataclass
class Script:
    """What the fake does; tests change it between calls."""

    redirect_to: str | None = None  # refuse writes with UNAVAILABLE + x-leader
    refuse_without_leader: int = 0  # refuse this many next calls with UNAVAILABLE, no x-leader
    refuse_no_quorum: int = 0  # refuse this many next calls with UNAVAILABLE + x-no-quorum
    role: str = "leader"
    leader_id: str = ""
    topics: dict[str, int] = field(default_factory=dict)  # name -> partitions
    logs: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)  # (topic, partition) -> values
    break_stream_after: int | None = None  # abort Subscribe with UNAVAILABLE after N records
    break_next_streams: int = 0  # abort this many next Subscribe calls with UNAVAILABLE before any record
    on_break: Callable[[], None] | None = None  # called as a stream is broken (e.g. records arrive meanwhile)
    create_then_drop_connection: bool = False  # apply CreateTopic, then answer UNAVAILABLE
    publish_delays_s: list[float] = field(default_factory=list)  # sleep before answering Publish #i
    publish_then_drop_connection: int = 0  # apply this many next Publishes, then answer UNAVAILABLE


def unpacked(request: broker_pb2.PublishRequest) -> broker_pb2.PublishRequest:
    """``request`` with its packed records (if any) as ``records``, so tests read either form alike."""
    if not request.packed_records:
        return request
    copy = broker_pb2.PublishRequest()
    copy.CopyFrom(request)
    del copy.packed_records[:]
    copy.records.extend(broker_pb2.PublishRecord.FromString(data) for data in request.packed_records)
    return copy


def _token(partition: int, next_offset: int) -> bytes:
    return PositionToken(1, partition, next_offset).encode()


class FakeNode(broker_pb2_grpc.BrokerServicer, admin_pb2_grpc.AdminServicer):
    """One fake node on 127.0.0.1 with an OS-chosen port."""

    def __init__(self, node_id: str = "f1") -> None:
        self.node_id = node_id
        self.script = Script()
        self.requests: list[tuple[str, object]] = []
        self.publishes_applied = 0
        self.packed_publishes = 0  # Publish calls that came in the packed form
        self.keys: dict[tuple[str, str], tuple[int, int, int]] = {}  # (topic, key) -> partition, offset, ts
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8)
        self._server = grpc.server(self._pool)
        broker_pb2_grpc.add_BrokerServicer_to_server(self, self._server)
        admin_pb2_grpc.add_AdminServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def calls(self, method: str) -> list[object]:
        with self._lock:
            return [r for m, r in self.requests if m == method]

    def _enter(self, method: str, request: object, context: grpc.ServicerContext, write: bool) -> None:
        with self._lock:
            self.requests.append((method, request))
            refuse = self.script.refuse_without_leader > 0
            if refuse:
                self.script.refuse_without_leader -= 1
            no_quorum = self.script.refuse_no_quorum > 0
            if no_quorum:
                self.script.refuse_no_quorum -= 1
        if no_quorum:
            context.set_trailing_metadata((("x-no-quorum", "1"),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "no quorum: (scripted)")
        if refuse:
            context.abort(grpc.StatusCode.UNAVAILABLE, "no leader (scripted)")
        if write and self.script.redirect_to:
            context.set_trailing_metadata((("x-leader", self.script.redirect_to),))
            context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader (scripted)")

    # -- Admin ----------------------------------------------------------------------------------

    def _info(self, name: str) -> admin_pb2.TopicInfo:
        parts = self.script.topics[name]
        return admin_pb2.TopicInfo(
            config=admin_pb2.TopicConfig(name=name, partitions=parts),
            incarnation=1,
            partitions=[
                admin_pb2.PartitionInfo(partition=p, end_offset=len(self.script.logs.get((name, p), [])))
                for p in range(parts)
            ],
        )

    def CreateTopic(
        self, request: admin_pb2.CreateTopicRequest, context: grpc.ServicerContext
    ) -> admin_pb2.TopicInfo:
        self._enter("CreateTopic", request, context, write=True)
        name = request.config.name
        if name in self.script.topics:
            abort(context, TopicExists(name))  # the server's own mapping: code, message, ErrorInfo
        self.script.topics[name] = request.config.partitions or 1
        if self.script.create_then_drop_connection:
            self.script.create_then_drop_connection = False
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped (scripted)")
        return self._info(name)

    def DescribeTopic(
        self, request: admin_pb2.DescribeTopicRequest, context: grpc.ServicerContext
    ) -> admin_pb2.TopicInfo:
        self._enter("DescribeTopic", request, context, write=False)
        if request.name not in self.script.topics:
            abort(context, TopicNotFound(request.name))
        return self._info(request.name)

    def NodeStatus(
        self, request: admin_pb2.NodeStatusRequest, context: grpc.ServicerContext
    ) -> admin_pb2.NodeInfo:
        leader_id = self.script.leader_id or (self.node_id if self.script.role == "leader" else "")
        return admin_pb2.NodeInfo(id=self.node_id, grpc_address=self.address, role=self.script.role,
                                  leader_id=leader_id)

    # -- Broker ---------------------------------------------------------------------------------

    def Publish(
        self, request: broker_pb2.PublishRequest, context: grpc.ServicerContext
    ) -> broker_pb2.PublishResponse:
        """Records what was sent with the packed records unpacked (``unpacked``) and answers one
        result per record whatever form was asked for (as a server may: the SDK reads both)."""
        self.packed_publishes += bool(request.packed_records)
        request = unpacked(request)
        self._enter("Publish", request, context, write=True)
        if self.script.publish_delays_s:
            time.sleep(self.script.publish_delays_s.pop(0))
        if request.topic not in self.script.topics:
            abort(context, TopicNotFound(request.topic))
        results = []
        with self._lock:
            for i, rec in enumerate(request.records):
                if request.first_msg_id:  # a producer-session batch: message ids stand in for keys here
                    rec = broker_pb2.PublishRecord()
                    rec.CopyFrom(request.records[i])
                    rec.idempotency_key = f"{request.dedup_id}#{request.first_msg_id + i}"
                known = self.keys.get((request.topic, rec.idempotency_key)) if rec.idempotency_key else None
                if known is not None:
                    results.append(broker_pb2.PublishResult(partition=known[0], offset=known[1], duplicate=True,
                                                            timestamp_ms=known[2]))
                    continue
                partition = rec.partition if rec.HasField("partition") else 0
                log = self.script.logs.setdefault((request.topic, partition), [])
                log.append(rec.value)
                now_ms = int(time.time() * 1000)  # as the broker: every stored record has the leader's time
                if rec.idempotency_key:
                    self.keys[(request.topic, rec.idempotency_key)] = (partition, len(log) - 1, now_ms)
                results.append(broker_pb2.PublishResult(partition=partition, offset=len(log) - 1,
                                                        timestamp_ms=now_ms))
            self.publishes_applied += 1
            drop = self.script.publish_then_drop_connection > 0
            if drop:
                self.script.publish_then_drop_connection -= 1
        if drop:
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection dropped after applying (scripted)")
        return broker_pb2.PublishResponse(results=results)

    def Subscribe(
        self, request: broker_pb2.SubscribeRequest, context: grpc.ServicerContext
    ) -> Iterator[broker_pb2.SubscribeResponse]:
        self._enter("Subscribe", request, context, write=False)
        parts = [request.partition] if request.HasField("partition") else range(self.script.topics[request.topic])
        position = getattr(request, "from")
        if self.script.break_next_streams > 0:
            self.script.break_next_streams -= 1
            if self.script.on_break is not None:
                self.script.on_break()
            context.abort(grpc.StatusCode.UNAVAILABLE, "stream broken before any record (scripted)")
        sent = 0
        for p in parts:
            start = 0
            if position.HasField("start") and position.start == common_pb2.START_POSITION_LATEST:
                start = len(self.script.logs.get((request.topic, p), []))
            elif position.HasField("token"):
                token = PositionToken.decode(position.token)
                assert token.partition == p, "a token is only sent for its own partition"
                start = token.next_offset
            elif position.HasField("offset"):
                start = position.offset
            for offset, value in enumerate(self.script.logs.get((request.topic, p), [])):
                if offset < start:
                    continue
                if self.script.break_stream_after is not None and sent >= self.script.break_stream_after:
                    self.script.break_stream_after = None
                    context.abort(grpc.StatusCode.UNAVAILABLE, "stream broken (scripted)")
                sent += 1
                record = common_pb2.Record(topic=request.topic, partition=p, offset=offset, value=value,
                                           position=_token(p, offset + 1))
                yield broker_pb2.SubscribeResponse(batch=broker_pb2.RecordBatch(records=[record]))
