"""The server's edge: public ``broker.v1`` requests to the plain inputs of the leader-side code, and
its plain results back to public responses (the server-side twin of ``broker.client.wire``).

Nothing behind this module sees a public message type: the stored and replicated configuration
types are the internal copies in ``internal_types.proto`` (package ``broker.internal.v1``). Their
field numbers and types equal those of the public messages, so a config crosses the edge by
re-parsing its bytes (:func:`_convert`); ``tests/core/test_internal_wire.py`` pins both message
families field by field, so a change to either side that breaks this fails there first. Fields a
newer public message might carry and the internal one does not know are dropped, never stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from google.protobuf.message import Message

from broker.core.errors import InvalidArgument
from broker.leader.groups.operations import GroupLag, GroupView
from broker.leader.packed_reads import PackedBatch
from broker.leader.publishing import PublishBatch, Published, PublishItem
from broker.leader.reading import Idle, Step, Subscription
from broker.leader.route_admin import RouteView
from broker.leader.topic_log import TopicView
from broker.services import packed
from broker.v1 import admin_pb2, broker_pb2, common_pb2, internal_pb2, routes_pb2

M = TypeVar("M", bound=Message)

# public message -> its internal twin (and back): the pairs tests/core/test_internal_wire.py pins
TWINS: tuple[tuple[type[Message], type[Message]], ...] = (
    (admin_pb2.TopicConfig, internal_pb2.TopicConfig),
    (common_pb2.Retention, internal_pb2.Retention),
    (common_pb2.GroupConfig, internal_pb2.GroupConfig),
    (common_pb2.Position, internal_pb2.Position),
    (routes_pb2.RouteConfig, internal_pb2.RouteConfig),
    # what the leader side reads and delivers (Record, Event and RecordBatch are nested in these)
    (broker_pb2.SubscribeResponse, internal_pb2.SubscribeResponse),
    (admin_pb2.DeadLetter, internal_pb2.DeadLetter),
)


def _convert(message: Message, into: type[M]) -> M:
    """``message`` as its twin type ``into`` (same field numbers and types; unknown fields dropped)."""
    out = into()
    out.ParseFromString(message.SerializeToString())
    out.DiscardUnknownFields()
    return out


# -- public -> internal -----------------------------------------------------------------------
def topic_config(config: admin_pb2.TopicConfig) -> internal_pb2.TopicConfig:
    return _convert(config, internal_pb2.TopicConfig)


def retention(caps: common_pb2.Retention) -> internal_pb2.Retention:
    return _convert(caps, internal_pb2.Retention)


def group_config(config: common_pb2.GroupConfig) -> internal_pb2.GroupConfig:
    return _convert(config, internal_pb2.GroupConfig)


def position(where: common_pb2.Position) -> internal_pb2.Position:
    return _convert(where, internal_pb2.Position)


def route_config(config: routes_pb2.RouteConfig) -> internal_pb2.RouteConfig:
    return _convert(config, internal_pb2.RouteConfig)


def subscription(request: broker_pb2.SubscribeRequest) -> Subscription:
    """A ``Subscribe`` as a :class:`Subscription`. With a group, its ``group_config`` is the config
    the group is created with if it does not exist yet: the request's, starting from the request's
    ``from`` unless it says where. Without a group the group's fields are refused, not ignored."""
    if not request.group and (request.member_id or request.max_in_flight or request.HasField("group_config")):
        raise InvalidArgument("member_id, max_in_flight and group_config belong to a group subscription: "
                              "give group, or leave them out")
    start = position(getattr(request, "from"))
    config = group_config(request.group_config)
    if not config.HasField("start_from") and request.HasField("from"):
        config.start_from.CopyFrom(start)
    return Subscription(topic=request.topic, start=start,
                        partition=request.partition if request.HasField("partition") else None,
                        filter=request.filter, max_batch=request.max_batch, stop_at_end=request.stop_at_end,
                        group=request.group, member_id=request.member_id, max_in_flight=request.max_in_flight,
                        group_config=config, compact=request.compact)


def group_info(view: GroupView) -> admin_pb2.GroupInfo:
    meta = view.meta
    info = admin_pb2.GroupInfo(topic=meta.topic, group=meta.group, config=public_group_config(meta.config),
                               paused=meta.paused, incarnation=meta.topic_id, dlq_topic=meta.dlq_topic,
                               created_ms=meta.created_ms,
                               prune_role=meta.prune_role)  # type: ignore[arg-type]  # same numbers
    for member, partitions in view.members:
        info.members.add(member_id=member, partitions=partitions)
    return info


def group_lag(lag: GroupLag) -> admin_pb2.GroupLagResponse:
    partitions = [admin_pb2.PartitionLag(partition=r.partition, start_offset=r.start_offset, end_offset=r.end_offset,
                                         committed=r.committed, lag=r.lag, in_flight=r.in_flight, retrying=r.retrying,
                                         dead=r.dead, lag_ms=r.lag_ms)
                  for r in lag.partitions]
    return admin_pb2.GroupLagResponse(paused=lag.paused, partitions=partitions, applied_index=lag.applied_index,
                                      node=lag.node)


_RESULT_FORMS = frozenset(broker_pb2.ResultForm.values())  # once, not a list per publish


def publish_batch(request: broker_pb2.PublishRequest, data: bytes | None = None) -> PublishBatch:
    """A ``PublishRequest`` as a :class:`PublishBatch`; the request is left as it was.

    Each body is the record re-serialized without its placement and dedup fields: ``PublishRecord``'s
    fields 4-9 equal ``RecordBody``'s (``tests/core/test_internal_wire.py`` pins the bytes). Copying
    the request once and clearing three fields per record costs a fraction of building each
    ``RecordBody`` from its fields (measured on this 2-core machine: ~2.5 against ~6-12 us per record;
    the old in-place clearing of the caller's request: ~1.1). The packed form
    (``packed_records``): :func:`broker.services.packed.packed_batch` (``data``: the request's bytes
    as received, when known). An unknown ``results`` form is refused (INVALID_ARGUMENT) before
    anything is submitted, as an unknown op is."""
    if request.results not in _RESULT_FORMS:
        raise InvalidArgument(f"unknown results form {request.results}; use RESULT_FORM_PER_RECORD (0) or "
                              "RESULT_FORM_COMPACT (1)")
    if request.packed_records:
        return packed.packed_batch(request, data)
    copy = broker_pb2.PublishRequest()
    copy.CopyFrom(request)
    copy.DiscardUnknownFields()  # body fields a client may not set (a forged producer, origin, ...)
    items = []
    for r in copy.records:
        partition = r.partition if r.HasField("partition") else None
        key = r.key if r.HasField("key") else None
        idempotency_key, msg_id = r.idempotency_key, r.msg_id
        if partition is not None or idempotency_key or msg_id:
            r.ClearField("partition")
            r.ClearField("idempotency_key")
            r.ClearField("msg_id")
        items.append(PublishItem(r.SerializeToString(), r.value, key, r.op, partition, idempotency_key, msg_id))
    return PublishBatch(topic=request.topic, records=items, dedup_id=request.dedup_id,
                        first_msg_id=request.first_msg_id)


# -- internal -> public -----------------------------------------------------------------------
def public_topic_config(config: internal_pb2.TopicConfig) -> admin_pb2.TopicConfig:
    return _convert(config, admin_pb2.TopicConfig)


def public_group_config(config: internal_pb2.GroupConfig) -> common_pb2.GroupConfig:
    return _convert(config, common_pb2.GroupConfig)


def public_route_config(config: internal_pb2.RouteConfig) -> routes_pb2.RouteConfig:
    return _convert(config, routes_pb2.RouteConfig)


def publish_response(published: Published, request: broker_pb2.PublishRequest) -> broker_pb2.PublishResponse:
    """The answer in the form ``request.results`` asks for: compact (per partition touched) unless
    a record is a duplicate, else one result per record."""
    if request.results == broker_pb2.RESULT_FORM_COMPACT:
        compact = packed.compact_response(published)
        if compact is not None:
            return compact
    response = broker_pb2.PublishResponse()
    add = response.results.add
    for partition, offset, timestamp_ms, duplicate in published.placements:
        add(partition=partition, offset=offset, timestamp_ms=timestamp_ms, duplicate=duplicate)
    return response


def topic_info(view: TopicView, with_schema: bool = True) -> admin_pb2.TopicInfo:
    """``view`` as a ``TopicInfo``; without its schema for listings (``has_schema`` still says
    whether there is one): schemas may be up to ``schema_bytes_max`` each, and a listing must fit
    one gRPC message however many topics there are."""
    info = admin_pb2.TopicInfo(config=public_topic_config(view.config), incarnation=view.incarnation,
                               created_ms=view.created_ms, has_schema=bool(view.config.schema_json))
    if not with_schema:
        info.config.schema_json = ""
    for p in view.partitions:
        info.partitions.add(partition=p.partition, start_offset=p.start_offset, end_offset=p.end_offset,
                            records=p.records, bytes=p.bytes)
    return info


def route_info(view: RouteView) -> routes_pb2.RouteInfo:
    meta = view.meta
    info = routes_pb2.RouteInfo(config=public_route_config(meta.config), route_id=meta.route_id,
                                created_ms=meta.created_ms, lag=view.lag, last_error=view.last_error,
                                copied=view.copied, skipped=view.skipped, lost=view.lost)
    for partition, next_offset, end_offset in view.partitions:
        info.partitions.add(partition=partition, next_offset=next_offset, end_offset=end_offset)
    return info


# -- internal -> public: the read path ------------------------------------------------------------
def subscribe_response(response: internal_pb2.SubscribeResponse) -> broker_pb2.SubscribeResponse:
    """The public twin of a leader-side response, by its bytes: one serialize and one parse per
    response (not per record). Unknown fields of a stored body pass through as they always did."""
    return broker_pb2.SubscribeResponse.FromString(response.SerializeToString())


def public_steps(steps: Iterator[Step]) -> Iterator[broker_pb2.SubscribeResponse | PackedBatch | Idle]:
    """The steps of a leader-side stream with every response made public (on the thread that runs
    the steps: the read pool, not the event loop); closing this closes ``steps``. A
    :class:`PackedBatch` is a public response already (its bytes, see ``broker.leader.packed_reads``)."""
    try:
        for step in steps:
            yield step if isinstance(step, Idle | PackedBatch) else subscribe_response(step)
    finally:
        close = getattr(steps, "close", None)
        if close is not None:
            close()


def dead_letters(items: list[internal_pb2.DeadLetter]) -> admin_pb2.ListDeadLettersResponse:
    """A ``ListDeadLetters`` answer (each dead letter and its record copied by its bytes, unknown
    fields kept as the record was stored)."""
    return admin_pb2.ListDeadLettersResponse(
        dead_letters=[admin_pb2.DeadLetter.FromString(item.SerializeToString()) for item in items])
