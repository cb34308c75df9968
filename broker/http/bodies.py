"""Request bodies of the HTTP API (pydantic models: they validate and make the OpenAPI schema).

Numbers are bounded to what the gRPC messages can carry, so an out-of-range number is a 400
here rather than a failure while building the protobuf message."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
PUBLISH_RECORDS_MAX = 10_000
CLAIM_MAX = 1000
RECEIPTS_MAX = 10_000

Count = Annotated[int, Field(ge=0, le=INT32_MAX)]
Offset = Annotated[int, Field(ge=0, le=INT64_MAX)]
Millis = Annotated[int, Field(ge=0, le=INT64_MAX)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


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
    value: Any = Field(None, description="JSON; a string is stored as its text, anything else as JSON text")
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
