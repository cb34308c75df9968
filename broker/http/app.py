"""The HTTP/JSON gateway (``/v1``): an ASGI app translating each request into SDK calls.

The grpc-gateway pattern: every rule (validation, limits, leadership, deduplication) stays in the
gRPC services; this module only translates JSON to the asyncio SDK's calls and its results and
errors back (errors: :mod:`broker.http.problems`). The SDK finds the leader and follows it, so a
gateway on a follower forwards writes to the leader itself (no 307: a client keeps one base URL,
a POST body is never replayed by a redirect-following client, and an SSE stream survives a
failover behind the gateway). ``Authorization: Bearer`` is passed to every gRPC call as metadata.
What HTTP alone needs is the gateway's own: a request body is capped before it is read whole
(:mod:`broker.http.body_limit`, 413).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from broker.client.aio import AsyncClient, call_metadata
from broker.client.errors import BrokerError, TopicExists, Unavailable, invalid_argument
from broker.client.models import OutgoingRecord
from broker.http import codec, problems, reading
from broker.http.bodies import BODY_MODELS, INT32_MAX, BodyRefused, JsonRoute, PruneBody, PublishBody, TopicBody
from broker.http.body_limit import BODY_BYTES_MAX, BodyLimit
from broker.http.groups import router as groups_router
from broker.http.guard import HTTP_LIMITS
from broker.security import VIA_GATEWAY_METADATA

READ_LIMIT_MAX = 1000
Topic = Annotated[str, Path(description="a topic name", examples=["orders"])]


class BearerPassThrough:
    """ASGI middleware: the request's ``Authorization`` header becomes the metadata of every gRPC call
    made while serving it (the SDK's ``call_metadata``); a header gRPC cannot carry is a 400. Every
    such call also says it comes through the gateway: with mTLS the gateway presents its node's
    certificate, which must not make a caller without a token that node's principal."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        value = dict(scope["headers"]).get(b"authorization")
        metadata: tuple[tuple[str, str], ...] = ((VIA_GATEWAY_METADATA, "1"),)
        if value is not None:
            if not all(0x20 <= b < 0x7F for b in value):
                response = problems.problem(400, "Invalid argument", "the Authorization header must be printable ASCII",
                                            "INVALID_ARGUMENT")
                await response(scope, receive, send)
                return
            metadata += (("authorization", value.decode()),)
        token = call_metadata.set(metadata)
        try:
            await self.app(scope, receive, send)
        finally:
            call_metadata.reset(token)


async def known_query(request: Request) -> None:
    """Refuse query parameters the endpoint does not take: a misspelt one (``partiton=1``) or one
    the HTTP API has not (``filter``) was ignored, and the caller read what it had not asked for."""
    route = request.scope.get("route")
    known = {param.alias for param in route.dependant.query_params} if isinstance(route, APIRoute) else set()
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
        raise invalid_argument(f"unknown query parameter(s) {', '.join(unknown)} for {request.url.path}: {takes}")


def create_app(bootstrap: Sequence[str], *, body_bytes_max: int = BODY_BYTES_MAX,
               watches_max: int = HTTP_LIMITS.watches_max, **client_options: Any) -> FastAPI:
    """The gateway for the cluster reached through ``bootstrap`` (gRPC addresses, this node's first);
    a request body over ``body_bytes_max`` is answered 413 unread; at most ``watches_max`` watches
    at once, more get 503 (``client_options``: the SDK's)."""
    watching = [0]  # live watches (the event loop's own: no lock)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncClient(list(bootstrap), **client_options) as client:
            app.state.client = client
            yield

    app = FastAPI(title="raftbroker", version="1", lifespan=lifespan, dependencies=[Depends(known_query)],
                  description="HTTP/JSON gateway of raftbroker: the gRPC API's rules, translated.")
    app.router.route_class = JsonRoute  # bodies are JSON, parsed strictly (broker.http.bodies)
    app.router.redirect_slashes = False  # ".../records/" is a 404 problem, not a 307 a POST would not follow

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = problems.document_problems(get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes))
            # the bodies as pydantic states them: FastAPI's own rendering turns every bound into a float
            # (2**63 - 1 became 9.223372036854776e+18, i.e. 2**63) and drops additionalProperties: false
            _, bodies = models_json_schema([(model, "validation") for model in BODY_MODELS],
                                           ref_template="#/components/schemas/{model}")
            schema["components"]["schemas"].update(bodies["$defs"])
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BearerPassThrough)
    app.add_middleware(BodyLimit, bytes_max=body_bytes_max)  # outermost: an oversized body goes no further
    app.include_router(groups_router)

    @app.exception_handler(BrokerError)
    async def broker_error(request: Request, err: BrokerError) -> Response:
        return problems.from_error(err)

    @app.exception_handler(BodyRefused)
    async def body_refused(request: Request, err: BodyRefused) -> Response:
        return problems.problem(err.status_code, err.title, str(err.detail), err.reason)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, err: RequestValidationError) -> Response:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors())
        return problems.problem(400, "Invalid argument", detail, "INVALID_ARGUMENT")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        reason = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(err.status_code, "HTTP_ERROR")
        return problems.problem(err.status_code, str(err.detail), f"{request.method} {request.url.path}: {err.detail}",
                                reason)

    def client(request: Request) -> AsyncClient:
        sdk: AsyncClient = request.app.state.client
        return sdk

    # -- topics ---------------------------------------------------------------------------------
    @app.put("/v1/topics/{topic}", tags=["topics"], status_code=201,
             responses={200: {"description": "The topic exists with this config already"}})
    async def create_topic(topic: Topic, body: TopicBody, request: Request, response: Response) -> dict[str, Any]:
        """Create a topic; the same config again answers 200 with it, a different one 409."""
        options: dict[str, Any] = dict(
            retention=body.retention.model_dump() if body.retention else None, durability=body.durability,
            full_policy=body.full_policy, dedup_window_ms=body.dedup_window_ms, schema=body.json_schema,
            dedup_fields=body.dedup_fields)
        try:
            info = await client(request).create_topic(topic, body.partitions, **options)
            response.status_code = 201
        except TopicExists as err:
            if err.after_unknown_outcome:
                raise
            info = await client(request).create_topic(topic, body.partitions, exist_ok=True, **options)
            response.status_code = 200
        return dataclasses.asdict(info)

    @app.get("/v1/topics", tags=["topics"])
    async def list_topics(request: Request) -> dict[str, Any]:
        return {"topics": [dataclasses.asdict(t) for t in await client(request).list_topics()]}

    @app.get("/v1/topics/{topic}", tags=["topics"])
    async def describe_topic(topic: Topic, request: Request) -> dict[str, Any]:
        return dataclasses.asdict(await client(request).describe_topic(topic))

    @app.delete("/v1/topics/{topic}", status_code=204, tags=["topics"])
    async def drop_topic(topic: Topic, request: Request) -> Response:
        await client(request).drop_topic(topic)
        return Response(status_code=204)

    # -- records --------------------------------------------------------------------------------
    @app.post("/v1/topics/{topic}/records", tags=["records"])
    async def publish(topic: Topic, body: PublishBody, request: Request) -> dict[str, Any]:
        """Publish all records or none; per record its partition, offset and whether it was a duplicate."""
        records = [OutgoingRecord(value=codec.stored_value(r.value if "value" in r.model_fields_set else codec.ABSENT,
                                                           r.value_b64, f"record {i}"),
                                  key=r.key, partition=r.partition, headers=r.headers,
                                  idempotency_key=r.idempotency_key)
                   for i, r in enumerate(body.records)]
        results = await client(request).publish_batch(topic, records)
        return {"results": [{"partition": r.partition, "offset": r.offset, "duplicate": r.duplicate,
                             "timestamp_ms": r.timestamp_ms} for r in results]}

    @app.get("/v1/topics/{topic}/records", tags=["records"])
    async def read(topic: Topic, request: Request,
                   partition: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
                   start: Annotated[str, Query(alias="from", max_length=codec.CURSOR_CHARS_MAX,
                                               description="earliest, latest, an offset or a cursor")] = "earliest",
                   limit: Annotated[int, Query(ge=1, le=READ_LIMIT_MAX)] = 100) -> dict[str, Any]:
        """Up to ``limit`` records (and loss events, inline in ``items``) from ``from``; read on from ``next``."""
        return await reading.read_page(client(request), topic, partition, start, limit)

    @app.get("/v1/topics/{topic}/watch", tags=["records"], response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
    async def watch(topic: Topic, request: Request,
                    partition: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
                    start: Annotated[str, Query(alias="from", max_length=codec.CURSOR_CHARS_MAX)] = "latest",
                    heartbeat_ms: Annotated[int, Query(ge=reading.HEARTBEAT_MS_MIN,
                                                       le=reading.HEARTBEAT_MS_MAX)] = 15_000,
                    last_event_id: Annotated[str | None, Header(max_length=codec.CURSOR_CHARS_MAX)] = None,
                    ) -> StreamingResponse:
        """Server-Sent Events, live: one ``record`` event per record (its ``id`` is the cursor after
        it: reconnect with ``Last-Event-ID`` to resume exactly there), loss events under their own
        type, a comment line as heartbeat."""
        if watching[0] >= watches_max:
            raise Unavailable("UNAVAILABLE", f"this node's gateway serves {watches_max} live watches, its most: "
                                             "retry later, or watch through another node", reason="WATCHES_FULL")
        places = await reading.start_places(client(request), topic, partition, start, last_event_id)
        stream = reading.watch(client(request), topic, places, heartbeat_ms)

        async def counted() -> AsyncIterator[str]:  # counted while it runs (a response never started is not)
            watching[0] += 1
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                watching[0] -= 1
                await stream.aclose()

        return StreamingResponse(counted(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # -- admin ----------------------------------------------------------------------------------
    @app.get("/v1/cluster", tags=["admin"])
    async def cluster_status(request: Request) -> dict[str, Any]:
        return dataclasses.asdict(await client(request).cluster_status())

    @app.get("/v1/cluster/verify", tags=["admin"])
    async def verify_replicas(request: Request) -> dict[str, Any]:
        """Every member's apply digest at one index (docs/operations.md, "Verifying replicas"):
        ``agreed``, and ``differing`` naming the nodes that decided some command differently."""
        return dataclasses.asdict(await client(request).verify_replicas())

    @app.post("/v1/topics/{topic}/prune", tags=["admin"])
    async def prune(topic: Topic, body: PruneBody, request: Request) -> dict[str, Any]:
        """Delete the records before ``before_offset`` (or up to a lead group's commits)."""
        pruned = await client(request).prune(topic, body.before_offset, body.partition, group=body.group)
        return {"pruned": pruned}

    @app.get("/v1/topics/{topic}/watermarks", tags=["admin"])
    async def watermarks(topic: Topic, request: Request) -> dict[str, Any]:
        return {"watermarks": [dataclasses.asdict(w) for w in await client(request).get_watermarks(topic)]}

    @app.delete("/v1/topics/{topic}/watermarks/{dedup_id}", status_code=204, tags=["admin"])
    async def reset_watermark(topic: Topic, dedup_id: str, request: Request) -> Response:
        await client(request).reset_watermark(topic, dedup_id)
        return Response(status_code=204)

    return app



