"""Reading over HTTP: a page of records from a cursor, and the same as a live SSE stream.

Both start each partition at a place: a record's position token (right after that record) or an
offset. ``from`` is "earliest" or "latest" (resolved to each partition's start or end offset
now), an offset (in each partition read), or a cursor (``next`` of a page, the ``id`` of an SSE
event). The cursor returned always covers every partition read, so reading again from it neither
skips nor repeats a record; a loss (records pruned, a topic re-created) is reported inline as an
event and the cursor moves past it. Records come from the SDK's subscription, which follows the
leader across failovers by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from broker.client import wire as client_wire
from broker.client.aio import AsyncClient, AsyncSubscription
from broker.client.errors import invalid_argument
from broker.client.models import Event, Record
from broker.http import codec, problems

HEARTBEAT_MS_MIN, HEARTBEAT_MS_MAX = 100, 300_000
WATCH_QUEUE_ITEMS = 16


async def start_places(client: AsyncClient, topic: str, partition: int | None, start: str | None,
                       last_event_id: str | None = None) -> dict[int, codec.Place]:
    """Where each partition read starts (see the module docstring)."""
    info = await client.describe_topic(topic)
    if partition is not None and partition >= info.partition_count:
        raise invalid_argument(f"partition {partition} does not exist (topic has {info.partition_count})")
    partitions = [partition] if partition is not None else list(range(info.partition_count))
    start = last_event_id or start or "earliest"
    by = {p.partition: p for p in info.partitions}

    def edge(p: int, latest: bool) -> int:
        return (by[p].end_offset if latest else by[p].start_offset) if p in by else 0

    if start in ("earliest", "latest"):
        return {p: edge(p, start == "latest") for p in partitions}
    if start.isascii() and start.isdigit():  # str.isdigit() alone takes "²" and "١" (int() reads the latter as 1)
        offset = int(start)
        if offset >= 2**63:
            raise invalid_argument(f"offset {start} is out of range")
        return dict.fromkeys(partitions, offset)
    places = codec.decode_cursor(start, "Last-Event-ID is not an event id of this API (the id of an SSE event)"
                                 if last_event_id else "from must be earliest, latest, an offset, or a cursor (the "
                                 "next value of a read, or an SSE event id)")
    unknown = sorted(set(places) - set(range(info.partition_count)))
    if unknown:
        raise invalid_argument(f"the cursor names partition(s) {unknown} the topic does not have")
    return {p: places[p] if p in places else edge(p, False) for p in partitions}


def subscription(client: AsyncClient, topic: str, places: dict[int, codec.Place], *, live: bool,
                 limit: int = 0) -> AsyncSubscription:
    """A subscription of the partitions of ``places`` (one, or all of the topic), each from its place."""
    only = next(iter(places)) if len(places) == 1 else None
    sub = client.subscribe(topic, partition=only, stop_at_end=not live, max_batch=min(limit, 1000))
    for p, place in places.items():
        if isinstance(place, bytes):
            sub.positions[p] = place
        else:
            sub.starts[p] = client_wire.position(place, None)
    return sub


def advance(places: dict[int, codec.Place], item: Record | Event) -> None:
    """Move the cursor past ``item``."""
    if isinstance(item, Record):
        if item.position:
            places[item.partition] = item.position
    elif item.position_after:
        places[item.partition] = item.position_after
    else:
        places[item.partition] = item.offset_after


async def read_page(client: AsyncClient, topic: str, partition: int | None, start: str | None, limit: int
                    ) -> dict[str, Any]:
    """Up to ``limit`` items from ``start``: records, and loss events inline as ``{"event": {...}}``;
    ``next`` is the cursor after them; ``caught_up`` when the log end was reached."""
    places = await start_places(client, topic, partition, start)
    items: list[dict[str, Any]] = []
    caught_up = True
    async with subscription(client, topic, dict(places), live=False, limit=limit) as sub:
        async for item in sub:
            if len(items) >= limit:
                caught_up = False
                break
            advance(places, item)
            items.append(codec.record_json(item) if isinstance(item, Record) else {"event": codec.event_json(item)})
    return {"records": items, "next": codec.encode_cursor(places), "caught_up": caught_up}


async def watch(client: AsyncClient, topic: str, places: dict[int, codec.Place], heartbeat_ms: int
                ) -> AsyncGenerator[str, None]:
    """Server-Sent Events: ``record`` events (``id``: the cursor right after it), loss events under
    their own type (``skip_forward``, ``reset``, ...), and a comment line every ``heartbeat_ms``.
    A stream that fails (its topic dropped, a permission revoked) ends with one ``error`` event
    whose data is the problem document an HTTP request would have had (``status``, ``reason``,
    ``detail``, ``grpc_code``)."""
    if not HEARTBEAT_MS_MIN <= heartbeat_ms <= HEARTBEAT_MS_MAX:
        raise invalid_argument(f"heartbeat_ms must be within [{HEARTBEAT_MS_MIN}, {HEARTBEAT_MS_MAX}]")
    sub = subscription(client, topic, dict(places), live=True)
    # a few items only: a client that stops reading leaves them and the transport's buffer held,
    # not a thousand records (up to 1 GiB of 1 MiB values per stream before)
    queue: asyncio.Queue[Record | Event | BaseException] = asyncio.Queue(maxsize=WATCH_QUEUE_ITEMS)

    async def pump() -> None:
        try:
            async for item in sub:
                await queue.put(item)
        except BaseException as err:  # noqa: BLE001 - reported to the stream, which ends
            await queue.put(err)
    task = asyncio.get_running_loop().create_task(pump())
    try:
        yield ": connected\n\n"
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), heartbeat_ms / 1000)
            except TimeoutError:
                yield ": heartbeat\n\n"
                continue
            if isinstance(item, BaseException):
                yield f"event: error\ndata: {codec.json_text(problems.body_of(item))}\n\n"
                return
            advance(places, item)
            kind, body = ("record", codec.record_json(item)) if isinstance(item, Record) else (
                item.type, codec.event_json(item))
            yield f"id: {codec.encode_cursor(places)}\nevent: {kind}\ndata: {codec.json_text(body)}\n\n"
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await sub.close()
