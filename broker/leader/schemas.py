"""Topic schemas (SPEC §2.3) and dedup fields (SPEC §4), checked on the leader before replication.

A schema is a JSON Schema; values of a topic with a schema must be JSON documents that validate.
A schema is self-contained: ``$ref`` resolves only inside the schema itself (never a file, a URL or
anything else outside it), and schemas and values are bounded in size and nesting depth
(:class:`SchemaLimits`), so no input can make the leader read, fetch or recurse without bound.
Dedup fields name top-level JSON fields (dotted paths reach into objects) whose values together
form a permanent unique key of the topic; the leader extracts the key and the state machine
enforces uniqueness (see ``BrokerStateMachine``).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import jsonschema_rs

from broker.core.errors import InvalidArgument, shown

_MISSING = object()


@dataclass(frozen=True)
class SchemaLimits:
    """Bounds on schemas and JSON values; a schema or value beyond one is refused (INVALID_ARGUMENT).

    ``schema_bytes_max`` also keeps ``DescribeTopic`` small; ``ListTopics`` never carries schemas.
    The depth limits stay well below what the JSON parser and the validator can recurse into.
    """

    schema_bytes_max: int = 256 * 1024
    schema_depth_max: int = 64
    json_value_depth_max: int = 128

    def __post_init__(self) -> None:
        assert 0 < self.schema_bytes_max <= 4 << 20, self.schema_bytes_max
        assert 0 < self.schema_depth_max <= 256, self.schema_depth_max
        assert 0 < self.json_value_depth_max <= 256, self.json_value_depth_max


LIMITS = SchemaLimits()


def _refuse_external(uri: str) -> NoReturn:
    """The ``$ref`` retriever: every reference outside the schema itself is refused, unread."""
    raise ValueError(f"external reference refused: a schema may only refer to itself ({shown(uri)})")


def json_depth(document: Any, stop_above: int) -> int:
    """Nesting depth of a parsed JSON document (a scalar is 0, ``[]`` is 1), iteratively; stops
    counting once it passes ``stop_above``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Iterable[Any] = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > stop_above:
                return deepest
        stack.extend((child, depth) for child in children)
    return deepest


def _parse_bounded(text: str | bytes, depth_max: int, what: str) -> Any:
    """``json.loads`` that refuses documents nested deeper than ``depth_max``, and NaN, Infinity and
    numbers beyond a double (InvalidArgument): Python reads them, RFC 8259 has none of them, and a
    schema check then saw ``null`` ("null is not of type number") where the record held NaN."""
    deep = InvalidArgument(f"{what} is nested deeper than {depth_max} levels")

    def constant(name: str) -> float:
        raise InvalidArgument(f"{what}: {name} is not JSON (RFC 8259 has no NaN or Infinity)")

    def finite(number: str) -> float:
        parsed = float(number)
        if math.isinf(parsed):
            raise InvalidArgument(f"{what}: the number {number[:40]} is beyond a double's range")
        return parsed

    try:
        document = json.loads(text, parse_constant=constant, parse_float=finite)
    except RecursionError:
        raise deep from None
    # Counting brackets is cheap; only a document with many of them needs the walk.
    raw = text.encode() if isinstance(text, str) else text
    brackets = raw.count(b"[") + raw.count(b"{")
    if brackets > depth_max and json_depth(document, depth_max) > depth_max:
        raise deep
    return document


def compile_schema(schema_json: str, limits: SchemaLimits = LIMITS) -> jsonschema_rs.Validator:
    """A validator for ``schema_json``; raises :class:`InvalidArgument` if it is not a valid,
    self-contained schema within ``limits``. Error messages never quote the schema whole."""
    size = len(schema_json.encode())
    if size > limits.schema_bytes_max:
        raise InvalidArgument(f"schema is {size} bytes, more than schema_bytes_max ({limits.schema_bytes_max})")
    try:
        schema = _parse_bounded(schema_json, limits.schema_depth_max, "schema")
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"schema is not valid JSON: {shown(str(exc), quote=False)}") from None
    if not isinstance(schema, dict | bool):
        raise InvalidArgument("schema must be a JSON object (a JSON Schema)")
    try:
        return jsonschema_rs.validator_for(schema, retriever=_refuse_external)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = shown(str(exc).splitlines()[0], quote=False, chars_max=400)
        raise InvalidArgument(f"schema is not a valid JSON Schema: {first}") from None


def validate_dedup_fields(fields: list[str]) -> None:
    for field in fields:
        if not field or any(not part for part in field.split(".")):
            raise InvalidArgument(f"invalid dedup field {shown(field)}: use a field name or a dotted path")
    if len(set(fields)) != len(fields):
        raise InvalidArgument("dedup fields must not repeat")


def parse_json(index: int, value: bytes, limits: SchemaLimits = LIMITS) -> Any:
    """The JSON document in a record's value; InvalidArgument if it is not JSON or is too deep."""
    try:
        return _parse_bounded(value, limits.json_value_depth_max, f"record {index}: value")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"record {index}: value is not valid JSON ({shown(str(exc), quote=False)})") from None


def check_value(validator: jsonschema_rs.Validator, index: int, document: Any) -> None:
    """Raise :class:`InvalidArgument` naming the record and the field that breaks the schema."""
    for error in validator.iter_errors(document):
        path = "/".join(str(p) for p in error.instance_path) or "(the document)"
        raise InvalidArgument(f"record {index}: field {shown(path, quote=False)}: {shown(error.message, quote=False)}")


def unique_key(index: int, document: Any, fields: list[str]) -> str:
    """The canonical key of a record's dedup fields; raises if one is missing."""
    values = []
    for field in fields:
        node: Any = document
        for part in field.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
            if node is _MISSING:
                raise InvalidArgument(f"record {index}: dedup field {shown(field)} is missing")
        values.append(node)
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


class SchemaCache:
    """Compiled validators per topic incarnation (topics are immutable in their schema)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._validators: dict[int, jsonschema_rs.Validator] = {}

    def get(self, topic_id: int, schema_json: str) -> jsonschema_rs.Validator:
        with self._lock:
            validator = self._validators.get(topic_id)
            if validator is None:
                validator = self._validators[topic_id] = compile_schema(schema_json)
            return validator

    def check_documents(self, topic_id: int, schema_json: str, dedup_fields: Sequence[str],
                        values: Iterable[bytes]) -> list[str]:
        """Validate every value against the topic's schema (if any) and return the dedup-field key
        of each (empty without dedup fields); the first failure raises InvalidArgument naming the
        record index, so a batch is refused whole."""
        if not schema_json and not dedup_fields:
            return []
        validator = self.get(topic_id, schema_json) if schema_json else None
        fields = list(dedup_fields)
        keys = []
        for i, value in enumerate(values):
            document = parse_json(i, value)
            if validator is not None:
                check_value(validator, i, document)
            if fields:
                keys.append(unique_key(i, document, fields))
        return keys
