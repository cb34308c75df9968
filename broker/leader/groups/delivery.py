"""The subscription stream of a consumer-group member (SPEC §3.2, §3.3).

A group stream runs on the leader. Each round it asks the group's runtime for up to
``max_in_flight`` unsettled deliveries for this stream (every record sent is a lease), sends the
events first (RESET, SKIP_FORWARD, BADMSG: each with the positions before and after), then the
records, and otherwise sleeps on the state machine's change signal (every apply wakes it: new
records, settlements, expired leases) or until the next retry falls due. It never polls the store
on a timer. Leaving leadership ends the stream with ``NotLeader`` (the client re-subscribes on the
new leader, which re-delivers whatever was in flight). With ``stop_at_end`` the stream ends once
nothing is deliverable to it right now although it has room (records it holds stay leased; retries
not due yet and paused groups count as nothing). Responses are bounded by count (``max_batch``) and
by bytes (``response_bytes_max``, a lone record always fits) like stateless reads; where the
stream would wait it yields an :class:`~broker.leader.reading.Idle` (see ``reading``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

from broker.core.errors import InvalidArgument
from broker.core.groups.config import validate_group_name, validate_member_id
from broker.core.topics import validate_name
from broker.leader.groups.runtime import GroupRuntime
from broker.leader.groups.service import GroupService
from broker.leader.reading import (
    DEFAULT_BATCH,
    MAX_BATCH,
    RECORD_FRAMING_BYTES,
    RESPONSE_BYTES_MAX,
    Idle,
    Step,
    Subscription,
    blocking,
    fits,
)
from broker.v1 import internal_pb2


def chunks(rows: list[internal_pb2.Record], count_max: int, bytes_max: int) -> Iterator[list[internal_pb2.Record]]:
    """``rows`` in order, cut into lists of at most ``count_max`` records and ``bytes_max`` bytes
    (a record larger than ``bytes_max`` goes alone)."""
    assert count_max > 0 and bytes_max > 0
    chunk: list[internal_pb2.Record] = []
    size = 0
    for row in rows:
        row_bytes = row.ByteSize()
        if len(chunk) >= count_max or not fits(size, row_bytes, len(chunk), bytes_max):
            yield chunk
            chunk, size = [], 0
        chunk.append(row)
        size += row_bytes + RECORD_FRAMING_BYTES
    if chunk:
        yield chunk

DEFAULT_IN_FLIGHT = 100
MAX_IN_FLIGHT = 10_000
WAKE_S = 0.5  # how often an idle stream re-checks its caller and this node's leadership
GROUP_FILTER_REFUSED = (
    "a group subscription cannot take a filter: records it skipped would have to be settled for the whole "
    "group, which the broker does not do yet (docs/design/groups.md); filter in the consumer and ack what it "
    "skips, or copy the matching records into their own topic with a filtered route and consume that")


class GroupDelivery:
    """Serves ``Subscribe`` requests that name a group."""

    def __init__(self, service: GroupService, response_bytes_max: int = RESPONSE_BYTES_MAX) -> None:
        assert response_bytes_max > 0
        self._service = service
        self._response_bytes_max = response_bytes_max

    def subscribe(self, request: Subscription,
                  is_active: Callable[[], bool]) -> Iterator[internal_pb2.SubscribeResponse]:
        """Validate ``request`` and create the group if needed (raising before the first item),
        then stream (waiting in place: blocks the thread)."""
        return blocking(self.subscribe_steps(request, is_active), self._service.state)

    def subscribe_steps(self, request: Subscription,
                        is_active: Callable[[], bool]) -> Iterator[Step]:
        """Validate ``request`` and create the group if needed with ``request.group_config``
        (raising before the first item), then stream, yielding :class:`Idle` where it would wait."""
        validate_name(request.topic)
        validate_group_name(request.group)
        if request.partition is not None:
            raise InvalidArgument("a group subscription reads every partition (the group assigns them): "
                                  "drop partition")
        if request.filter:
            raise InvalidArgument(GROUP_FILTER_REFUSED)
        if request.max_in_flight > MAX_IN_FLIGHT or request.max_batch > MAX_BATCH:
            raise InvalidArgument(f"max_in_flight must be at most {MAX_IN_FLIGHT} and max_batch at most {MAX_BATCH}")
        validate_member_id(request.member_id)
        rt = self._service.ensure(request.topic, request.group, request.group_config)
        member = request.member_id
        if rt.members is not None:
            if request.group_config.mode == internal_pb2.DELIVERY_MODE_QUEUE:
                raise InvalidArgument(f"group {request.group!r} is a stream-mode group: subscribe with mode stream "
                                      "(members join with JoinGroup and keep alive with Heartbeat), or leave the "
                                      "mode out and join")
            if not member:
                raise InvalidArgument("a stream-mode group needs a member_id (join with JoinGroup, keep it "
                                      "alive with Heartbeat)")
            self._service.heartbeat(request.topic, request.group, member)
        elif member:
            rt.rejoin(member)
        return self._stream(request, rt, member or f"q-{uuid.uuid4().hex[:12]}", is_active)

    def _stream(self, request: Subscription, rt: GroupRuntime, member: str,
                is_active: Callable[[], bool]) -> Iterator[Step]:
        service, state = self._service, self._service.state
        limit = request.max_in_flight or DEFAULT_IN_FLIGHT
        batch_size = request.max_batch or DEFAULT_BATCH
        stream_id = rt.open_stream()
        try:
            while is_active():
                seen = state.version
                current = service.runtime(request.topic, request.group)  # leadership, deletion, re-creation
                if current is not rt:
                    rt.close_stream(stream_id)
                    rt, stream_id = current, current.open_stream()
                now = service.clock.now_ms()
                with rt.lock:  # the room and the pick at once: a settle ending between them must see the pick
                    room = limit - rt.leases.held_by(stream_id)
                    delivery = rt.pick(stream_id, member, room, now, service.clock.monotonic_ms())
                if delivery.bad:
                    service.settle(rt, delivery.bad)
                for event in delivery.events:
                    yield internal_pb2.SubscribeResponse(event=event)
                for chunk in chunks(list(delivery.records), batch_size, self._response_bytes_max):
                    yield internal_pb2.SubscribeResponse(batch=internal_pb2.RecordBatch(records=chunk))
                if delivery:
                    continue
                if request.stop_at_end and room > 0:  # caught up: nothing deliverable now
                    return
                due = rt.next_due_ms(member, now)
                timeout_s = WAKE_S if due is None else min(WAKE_S, max(due - now, 1) / 1000)
                yield Idle(seen, timeout_s)
        finally:
            rt.close_stream(stream_id)
