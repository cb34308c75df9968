"""Topic schemas (SPEC §2.3) and dedup fields (SPEC §4), checked on the leader before replication.

A schema is a JSON Schema; values of a topic with a schema must be JSON documents that validate.
Dedup fields name top-level JSON fields (dotted paths reach into objects) whose values together
form a permanent unique key of the topic; the leader extracts the key and the state machine
enforces uniqueness (see ``BrokerStateMachine``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import jsonschema_rs

from broker.core.errors import InvalidArgument

_MISSING = object()


def compile_schema(schema_json: str) -> jsonschema_rs.Validator:
    """A validator for ``schema_json``; raises :class:`InvalidArgument` if it is not a valid schema."""
    try:
        schema = json.loads(schema_json)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict | bool):
        raise InvalidArgument("schema must be a JSON object (a JSON Schema)")
    try:
        return jsonschema_rs.validator_for(schema)
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise InvalidArgument(f"schema is not a valid JSON Schema: {first}") from None


def validate_dedup_fields(fields: list[str]) -> None:
    for field in fields:
        if not field or any(not part for part in field.split(".")):
            raise InvalidArgument(f"invalid dedup field {field!r}: use a field name or a dotted path")
    if len(set(fields)) != len(fields):
        raise InvalidArgument("dedup fields must not repeat")


def parse_json(index: int, value: bytes) -> Any:
    try:
        return json.loads(value)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"record {index}: value is not valid JSON ({exc})") from None


def check_value(validator: jsonschema_rs.Validator, index: int, document: Any) -> None:
    """Raise :class:`InvalidArgument` naming the record and the field that breaks the schema."""
    for error in validator.iter_errors(document):
        path = "/".join(str(p) for p in error.instance_path) or "(the document)"
        raise InvalidArgument(f"record {index}: field {path}: {error.message}")


def unique_key(index: int, document: Any, fields: list[str]) -> str:
    """The canonical key of a record's dedup fields; raises if one is missing."""
    values = []
    for field in fields:
        node: Any = document
        for part in field.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
            if node is _MISSING:
                raise InvalidArgument(f"record {index}: dedup field {field!r} is missing")
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
