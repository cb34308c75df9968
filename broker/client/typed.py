"""Typed topics (SPEC §2.3, §6): a topic whose values are the JSON of a Pydantic model.

``client.topic("videos", Video)`` opens the topic ``videos`` for the model ``Video``:

- if the topic does not exist, it is created (``partitions`` and any other ``create_topic``
  option may be given) with the model's JSON schema, so the server validates every value;
- if it exists, its stored schema must be *compatible* with the model, else
  :class:`SchemaMismatchError` is raised before anything is published or read.

**Compatible** means one of:

1. the two schemas are equal after normalization (annotations such as ``title``,
   ``description``, ``examples``, ``default`` and ``$comment`` are ignored, ``$ref``\\ s into
   ``$defs`` are inlined, ``required`` is compared as a set); or
2. field by field, both are object schemas and
   - every field the model requires is required by the stored schema, with the same type;
   - every field the stored schema requires is a field of the model, with the same type
     (the SDK always sends every field of the model);
   - every other field both declare has the same type;
   - a field only the model declares is allowed unless the stored schema forbids additional
     properties, and a field only the stored schema declares is allowed unless the model
     forbids extra fields.

"The same type" is equality of the normalized field schemas. So a model may add optional fields
to a topic (or drop optional ones), but never change a field's type or what is required. A topic
without a schema is not compatible: nothing guarantees its values fit the model.

Values are published as ``model.model_dump_json(by_alias=True)``; a dict is validated into the
model first. Reading yields model instances; a stored value that does not fit the model raises
:class:`SchemaMismatchError` naming its partition and offset.

The asyncio SDK's typed topics (:mod:`broker.client.aio.typed`) check, encode and decode with the
plain functions here (:func:`check_model`, :func:`check_topic_schema`, :func:`model_value`,
:func:`model_records`, :func:`decode`); only their calls are awaited.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from pydantic import BaseModel, ValidationError

from broker.client.errors import SchemaMismatchError, TopicExists, invalid_argument
from broker.client.handlers import log_event
from broker.client.models import Event, OutgoingRecord, PublishResult, PublishResults, Record, TopicInfo
from broker.client.subscription import Subscription

if TYPE_CHECKING:
    from broker.client.client import Client

M = TypeVar("M", bound=BaseModel)

_ANNOTATIONS = frozenset({"title", "description", "examples", "default", "$comment", "deprecated", "readOnly",
                          "writeOnly", "$schema", "$id"})
_MAX_DEPTH = 32


def normalize_schema(schema: Any) -> Any:
    """``schema`` without annotations, with local ``$ref``\\ s inlined and ``required`` sorted."""
    if not isinstance(schema, dict):
        return schema
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    return _normalize(schema, defs, 0)


def _normalize(node: Any, defs: Mapping[str, Any], depth: int) -> Any:
    if isinstance(node, list):
        return [_normalize(x, defs, depth) for x in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and depth < _MAX_DEPTH:
        name = ref.rsplit("/", 1)[-1]
        if ref.startswith(("#/$defs/", "#/definitions/")) and name in defs:
            merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
            return _normalize(merged, defs, depth + 1)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _ANNOTATIONS or key in ("$defs", "definitions"):
            continue
        if key in ("properties", "patternProperties") and isinstance(value, dict):
            out[key] = {name: _normalize(sub, defs, depth) for name, sub in value.items()}
        elif key == "required" and isinstance(value, list):
            out[key] = sorted(value)
        else:
            out[key] = _normalize(value, defs, depth)
    return out


def incompatibility(stored: Any, model: Any) -> str | None:
    """Why a topic whose schema is ``stored`` cannot carry values of a model whose schema is
    ``model`` (see the module docstring), or None when it can."""
    a, b = normalize_schema(stored), normalize_schema(model)
    if a == b:
        return None
    if not (isinstance(a, dict) and isinstance(b, dict) and a.get("type") == "object" == b.get("type")):
        return "the schemas differ and are not both object schemas"
    stored_props, model_props = a.get("properties", {}), b.get("properties", {})
    stored_req, model_req = set(a.get("required", [])), set(b.get("required", []))
    missing = sorted(model_req - stored_req)
    if missing:
        return f"field {missing[0]!r} is required by the model but not by the topic's schema"
    for name in sorted(stored_req):
        if name not in model_props:
            return f"field {name!r} is required by the topic's schema but is not a field of the model"
    for name in sorted(set(stored_props) & set(model_props)):
        if stored_props[name] != model_props[name]:
            return (f"field {name!r} has another type in the topic's schema ({json.dumps(stored_props[name])}) "
                    f"than in the model ({json.dumps(model_props[name])})")
    if a.get("additionalProperties") is False and set(model_props) - set(stored_props):
        extra = ", ".join(sorted(set(model_props) - set(stored_props)))
        return f"the topic's schema forbids fields the model has: {extra}"
    if b.get("additionalProperties") is False and set(stored_props) - set(model_props):
        extra = ", ".join(sorted(set(stored_props) - set(model_props)))
        return f"the model forbids fields the topic's schema allows: {extra}"
    for keyword in sorted((set(a) | set(b)) - {"type", "properties", "required", "additionalProperties"}):
        if a.get(keyword) != b.get(keyword):
            return f"the schemas differ in {keyword!r}"
    return None


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def check_model(model: object) -> None:
    """InvalidArgument unless ``model`` is a pydantic model class."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise invalid_argument(f"a typed topic needs a pydantic model class, got {model!r}")


def check_topic_schema(info: TopicInfo, model: type[BaseModel], schema: Mapping[str, Any]) -> None:
    """:class:`SchemaMismatchError` unless the topic ``info`` describes can carry ``model`` (whose
    schema is ``schema``): see the module docstring."""
    name = info.name
    if not info.schema_json:
        raise SchemaMismatchError("FAILED_PRECONDITION", f"topic {name!r} has no schema, so nothing guarantees "
                                  f"its values fit {model.__name__}; create it with the model's schema")
    reason = incompatibility(json.loads(info.schema_json), schema)
    if reason is not None:
        raise SchemaMismatchError("FAILED_PRECONDITION", f"topic {name!r} cannot carry {model.__name__}: {reason}")


def model_value(model: type[M], item: M | Mapping[str, Any]) -> str:
    """The JSON published for ``item`` (an instance, or a dict validated into one first)."""
    if isinstance(item, model):
        return item.model_dump_json(by_alias=True)
    if isinstance(item, Mapping):
        try:
            return model.model_validate(item).model_dump_json(by_alias=True)
        except ValidationError as err:
            raise invalid_argument(f"the value does not fit {model.__name__}: {err}") from None
    raise invalid_argument(f"publish a {model.__name__} or a dict, got {type(item).__name__}")


def model_records(model: type[M], items: Sequence[M | Mapping[str, Any]],
                  key: Callable[[M], bytes | str | None] | None) -> list[OutgoingRecord]:
    """The records of a typed ``publish_batch``; ``key(instance)`` picks each one's key."""
    values = [model_value(model, item) for item in items]
    records = []
    for item, value in zip(items, values, strict=True):
        instance = item if isinstance(item, model) else model.model_validate_json(value)
        records.append(OutgoingRecord(value=value, key=key(cast(M, instance)) if key else None))
    return records


def decode(model: type[M], record: Record) -> M:
    """``record``'s value as a ``model`` instance; :class:`SchemaMismatchError` (naming where the
    record is) when it does not fit."""
    try:
        return model.model_validate_json(record.value)
    except ValidationError as err:
        raise SchemaMismatchError(
            "FAILED_PRECONDITION",
            f"{record.topic} partition {record.partition} offset {record.offset}: the value does not fit "
            f"{model.__name__}: {err.errors()[0]['msg']}") from None


class TypedSubscription(Iterator[M], Generic[M]):
    """Model instances of a subscription; :attr:`record` is the record of the last one yielded.

    Events (``skip_forward``, ``reset``, ...) go to ``on_event`` (default: a logged warning)."""

    def __init__(self, subscription: Subscription, model: type[M], on_event: Callable[[Event], None] | None) -> None:
        self._subscription = subscription
        self._model = model
        self._on_event = on_event or log_event
        self.record: Record | None = None

    def __iter__(self) -> TypedSubscription[M]:
        return self

    def __next__(self) -> M:
        while True:
            item = next(self._subscription)
            if isinstance(item, Event):
                self._on_event(item)
                continue
            self.record = item
            return decode(self._model, item)

    def close(self) -> None:
        self._subscription.close()

    def __enter__(self) -> TypedSubscription[M]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TypedTopic(Generic[M]):
    """A topic bound to the Pydantic model ``model``; see the module docstring."""

    def __init__(self, client: Client, info: TopicInfo, model: type[M]) -> None:
        self._client = client
        self.info = info
        self.model = model

    @property
    def name(self) -> str:
        return self.info.name

    @classmethod
    def open(cls, client: Client, name: str, model: type[M], *, partitions: int = 1,
             **create_options: Any) -> TypedTopic[M]:
        """Create ``name`` with ``model``'s schema, or check the existing topic's schema."""
        check_model(model)
        schema = model_schema(model)
        try:
            info = client.create_topic(name, partitions, schema=schema, **create_options)
        except TopicExists:
            info = client.describe_topic(name)
        check_topic_schema(info, model, schema)
        return cls(client, info, model)

    def publish(self, item: M | Mapping[str, Any], *, key: bytes | str | None = None, partition: int | None = None,
                headers: Mapping[str, str] | None = None, idempotency_key: str | None = None) -> PublishResult:
        """Publish one model instance (or a dict validated into one)."""
        return self._client.publish(self.name, model_value(self.model, item), key=key, partition=partition,
                                    headers=headers, idempotency_key=idempotency_key)

    def publish_batch(self, items: Sequence[M | Mapping[str, Any]], *,
                      key: Callable[[M], bytes | str | None] | None = None) -> PublishResults:
        """Publish instances all-or-nothing; ``key(instance)`` picks each record's key."""
        return self._client.publish_batch(self.name, model_records(self.model, items, key))

    def subscribe(self, *, start: str | int | bytes = "earliest", partition: int | None = None,
                  timestamp_ms: int | None = None, stop_at_end: bool = False, filter: str | None = None,
                  on_event: Callable[[Event], None] | None = None) -> TypedSubscription[M]:
        """Model instances from a position (see :meth:`Client.subscribe`)."""
        subscription = self._client.subscribe(self.name, partition=partition, start=start, timestamp_ms=timestamp_ms,
                                              stop_at_end=stop_at_end, filter=filter)
        return TypedSubscription(subscription, self.model, on_event)

    def __iter__(self) -> Iterator[M]:
        """Every instance from the earliest retained one on, then live."""
        return self.subscribe()


class TypedTopicsMixin:
    """``Client.topic(name, Model)``."""

    def topic(self, name: str, model: type[M], *, partitions: int = 1, **create_options: Any) -> TypedTopic[M]:
        """Open a typed topic (created with the model's schema if missing); see :mod:`broker.client.typed`."""
        return TypedTopic.open(cast("Client", self), name, model, partitions=partitions, **create_options)
