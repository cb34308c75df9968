"""Consumer groups over HTTP: claim leases, settle them by receipt, read the lag.

A claim leases up to ``max`` deliverable records of a queue group to the caller and returns at
once (possibly none); each message carries a ``receipt`` (its position token) that ``ack``,
``nack`` and ``extend`` take, and the response's ``events`` report what the group lost before
them. An unsettled lease runs out after ``visibility_ms`` (or the group's visibility timeout) and
the record is delivered again: at-least-once, as over gRPC.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from broker.client import checks
from broker.client.aio import AsyncClient
from broker.http import codec
from broker.http.bodies import AckBody, ClaimBody, ExtendBody, JsonRoute, NackBody

router = APIRouter(prefix="/v1/topics/{topic}/groups/{group}", tags=["groups"], route_class=JsonRoute)
Topic = Annotated[str, Path(description="a topic name", examples=["orders"])]
Group = Annotated[str, Path(description="a group name", examples=["workers"])]


def _client(request: Request) -> AsyncClient:
    sdk: AsyncClient = request.app.state.client
    return sdk


def _positions(receipts: list[str]) -> list[bytes]:
    return [codec.receipt(r, f"receipt {i}") for i, r in enumerate(receipts)]


@router.post("/claim")
async def claim(topic: Topic, group: Group, body: ClaimBody, request: Request) -> dict[str, Any]:
    """Lease up to ``max`` records (creating the queue group on first use). ``events``: the group's
    events sent before them (``skip_forward`` for records pruned before anyone received them): an
    ack of a message that came after one tells the group that it was received."""
    messages = await _client(request).claim(topic, group, max_records=body.max, visibility_ms=body.visibility_ms)
    return {"messages": [{**codec.record_json(m.record), "receipt": codec.b64url(m.position),
                          "delivery_attempt": m.delivery_attempt} for m in messages],
            "events": [codec.event_json(e) for e in messages.events]}


@router.post("/ack")
async def ack(topic: Topic, group: Group, body: AckBody, request: Request) -> dict[str, Any]:
    """Settle for good (idempotent): ``acked`` counts the receipts sent, ``settled`` the records
    this call settled, and ``not_settled`` lists the indexes of the receipts whose records it did
    not (settled before, a repeat earlier in the list, a receipt of an older incarnation of the
    topic)."""
    settled = await _client(request).settle("ack", topic, group, _positions(body.receipts))
    return {"acked": len(body.receipts), "settled": sum(settled),
            "not_settled": [i for i, one in enumerate(settled) if not one]}


@router.post("/nack")
async def nack(topic: Topic, group: Group, body: NackBody, request: Request) -> dict[str, Any]:
    """Failed: delivered again after ``delay_ms`` (or the group's backoff)."""
    await _client(request).settle("nack", topic, group, _positions(body.receipts), delay_ms=body.delay_ms)
    return {"nacked": len(body.receipts)}


@router.post("/extend")
async def extend(topic: Topic, group: Group, body: ExtendBody, request: Request) -> dict[str, Any]:
    """Keep the leases longer; per receipt the new deadline (ms since the epoch), 0 if it was lost."""
    if body.ms is not None:  # checked here to name the body's field (the SDK's argument is extend_ms)
        checks.check_int(body.ms, "body.ms (the leases' new length)", 1, checks.EXTEND_MAX_MS)
    deadlines = await _client(request).settle("extend", topic, group, _positions(body.receipts), extend_ms=body.ms)
    return {"deadlines_ms": deadlines}


@router.get("/lag")
async def lag(topic: Topic, group: Group, request: Request) -> dict[str, Any]:
    info = await _client(request).group_lag(topic, group)
    return {**dataclasses.asdict(info), "lag": info.lag}
