"""Typed topics without a cluster: what "compatible" means between a stored schema and a model."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from broker.client.typed import incompatibility, normalize_schema

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Tag(BaseModel):
    name: str


class Video(BaseModel):
    url: str
    title: str = Field(description="shown to people")
    views: int = 0
    tags: list[Tag] = []


def schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def test_equal_after_normalization_ignores_annotations_and_inlines_refs() -> None:
    stored = schema(Video)
    stored["title"] = "Something else"
    stored["properties"]["url"]["description"] = "where"
    stored["required"] = list(reversed(stored["required"]))
    assert incompatibility(stored, schema(Video)) is None
    inlined = normalize_schema(schema(Video))
    assert inlined["properties"]["tags"]["items"] == {"properties": {"name": {"type": "string"}},
                                                      "required": ["name"], "type": "object"}


def test_a_model_may_add_or_drop_optional_fields() -> None:
    class VideoV2(Video):
        language: str | None = None

    class Lean(BaseModel):
        url: str
        title: str

    assert incompatibility(schema(Video), schema(VideoV2)) is None
    assert incompatibility(schema(Video), schema(Lean)) is None


def test_changed_types_and_requirements_are_incompatible() -> None:
    class ViewsAsText(BaseModel):
        url: str
        title: str
        views: str = ""

    class RequiresMore(Video):
        channel: str

    class MissesRequired(BaseModel):
        url: str

    class Strict(BaseModel):
        model_config = ConfigDict(extra="forbid")
        url: str
        title: str

    assert "views" in (incompatibility(schema(Video), schema(ViewsAsText)) or "")
    assert "channel" in (incompatibility(schema(Video), schema(RequiresMore)) or "")
    assert "title" in (incompatibility(schema(Video), schema(MissesRequired)) or "")
    assert "forbids" in (incompatibility(schema(Video), schema(Strict)) or "")
    closed = {**schema(Video), "additionalProperties": False}

    class Extra(Video):
        extra: int = 0

    assert "forbids" in (incompatibility(closed, schema(Extra)) or "")
    assert incompatibility({"type": "string"}, schema(Video)) is not None
