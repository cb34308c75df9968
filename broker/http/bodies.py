"""Request bodies of the HTTP API (pydantic models: they validate and make the OpenAPI schema).

Numbers are bounded to what the gRPC messages can carry, so an out-of-range number is a 400
here rather than a failure while building the protobuf message.

A body is JSON sent as ``application/json`` (or ``+json``) and nothing else (:class:`JsonRoute`):
another content type, or none, is a 415 saying so (before, the body reached the models as bytes and
the client read "Input should be a valid dictionary"); the body is parsed by
:func:`broker.http.strict_json.parse`, so NaN, Infinity, deep nesting and overlong numbers are each
a 400 with their own reason, naming where they are, instead of being stored or a bare parse error.
"""

from __future__ import annotations

import email.message
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field

from broker.http import strict_json

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
PUBLISH_RECORDS_MAX = 10_000
CLAIM_MAX = 1000
RECEIPTS_MAX = 10_000

Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
Offset = Annotated[int, Field(ge=0, le=INT64_MAX)]
Millis = Annotated[int, Field(ge=0, le=INT64_MAX)]


class Strict(BaseModel):
    """Unknown fields are refused, and values must have their JSON type: pydantic's default lax
    mode took ``true`` and ``"3"`` and ``1.0`` for integers (``{"before_offset": true}`` pruned a
    record)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)


class RetentionBody(Strict):
    max_age_ms: Millis | None = None
    max_records: Offset | None = None
    max_bytes: Offset | None = None


class TopicBody(Strict):
    """The fields of ``raftbroker topic create`` (absent: the server's default)."""

    partitions: Annotated[int, Field(ge=1, le=INT32_MAX)] = 1
    retention: RetentionBody | None = None
    durability: str | None = Field(None, description="memory, disk, fsync or ephemeral")
    full_policy: str | None = Field(None, description="discard_old or reject")
    dedup_window_ms: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = Field(
        None, description="how long idempotency keys are remembered; -1: forever")
    json_schema: dict[str, Any] | None = Field(None, alias="schema", description="a JSON Schema every value must fit")
    dedup_fields: list[str] | None = None


class RecordBody(Strict):
    value: Any = Field(None, description="JSON; a string is stored as its text, anything else (null too) as JSON "
                                         "text")
    value_b64: str | None = Field(None, description="raw bytes, base64 (instead of value)")
    key: str | None = None
    partition: Count | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    idempotency_key: str | None = Field(None, description="a repeat within the dedup window is stored once")


class PublishBody(Strict):
    records: Annotated[list[RecordBody], Field(min_length=1, max_length=PUBLISH_RECORDS_MAX)]


class ClaimBody(Strict):
    max: Annotated[int, Field(ge=1, le=CLAIM_MAX)] = 1
    visibility_ms: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = Field(
        None, description="the leases end this long from now (absent: the group's visibility timeout)")


Receipts = Annotated[list[str], Field(min_length=1, max_length=RECEIPTS_MAX,
                                      description="the receipts of claimed messages")]


class AckBody(Strict):
    receipts: Receipts


class NackBody(Strict):
    receipts: Receipts
    delay_ms: Millis | None = Field(None, description="redeliver after this long (absent: the group's backoff)")


class ExtendBody(Strict):
    receipts: Receipts
    ms: Annotated[int, Field(ge=1, le=INT64_MAX)] | None = Field(
        None, description="the leases end this long from now (absent: the visibility timeout)")


class PruneBody(Strict):
    before_offset: Offset | None = None
    partition: Count | None = None
    group: str | None = Field(None, description="a group marked lead: prune up to what it committed")


# -- how a body is read ------------------------------------------------------------------------
UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
_TITLES = {strict_json.NOT_JSON: "Invalid JSON", strict_json.TOO_DEEP: "JSON nested too deeply",
           strict_json.NUMBER_TOO_LONG: "Number too long", UNSUPPORTED_MEDIA_TYPE: "Unsupported media type"}


BODY_MODELS: tuple[type[Strict], ...] = (RetentionBody, TopicBody, RecordBody, PublishBody, ClaimBody, AckBody,
                                        NackBody, ExtendBody, PruneBody)


class BodyRefused(HTTPException):
    """A request body refused before the models see it; answered as a problem with ``reason``.

    An ``HTTPException`` because FastAPI passes those on from reading the body (any other error
    there becomes its bare "There was an error parsing the body")."""

    def __init__(self, status_code: int, detail: str, reason: str) -> None:
        super().__init__(status_code, detail)
        self.reason = reason
        self.title = _TITLES[reason]


def is_json(content_type: str | None) -> bool:
    """True for ``application/json`` and ``application/*+json`` (with any parameters), as FastAPI reads them."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class StrictJsonRequest(Request):
    """A request whose JSON body is parsed by :func:`strict_json.parse` (FastAPI calls :meth:`json`)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = strict_json.parse(await self.body(), "body")
            except strict_json.NotJson as err:
                raise BodyRefused(400, err.detail, err.reason) from None
        return self._json


class JsonRoute(APIRoute):
    """A route whose body, when it takes one, must be JSON (else 415) and is parsed strictly."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strict_handler(request: Request) -> Response:
            content_type = request.headers.get("content-type")
            if not is_json(content_type):
                got = f"content-type {content_type}" if content_type else "no content-type"
                raise BodyRefused(415, f"the request body must be JSON, sent with content-type: application/json "
                                  f"(got {got})", UNSUPPORTED_MEDIA_TYPE)
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return strict_handler
