"""Server-side record filters in CEL (SPEC §3.4), compiled once per subscription.

Variables: ``key`` (bytes, or null), ``headers`` (map of strings), ``op`` ("insert", "update",
"delete", "tombstone"), ``partition`` (int), ``timestamp_ms`` (int) and ``value``: the JSON document
when the value is JSON, else its raw bytes. A record matches when the expression evaluates to
``true``; an evaluation error (for example a missing field: use ``has(value.field)``) means no match.
CEL library: ``common-expression-language`` (Rust core), ~9 us per evaluation here against
~410 us for the pure-Python ``cel-python``.
"""

from __future__ import annotations

import json
from typing import Any

import cel

from broker.core.errors import InvalidArgument
from broker.v1 import common_pb2

MAX_EXPRESSION_CHARS = 4096
_OPS = {v: k.removeprefix("OP_").lower() for k, v in common_pb2.Op.items()}
_VARIABLES = {"key", "headers", "op", "partition", "timestamp_ms", "value"}


class RecordExpression:
    """A compiled CEL expression over one record (filters, route partition keys); ``what`` names
    it in error messages."""

    def __init__(self, expression: str, what: str = "filter") -> None:
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise InvalidArgument(f"{what} is longer than {MAX_EXPRESSION_CHARS} characters")
        try:
            self._program = cel.compile(expression)
        except (ValueError, RuntimeError) as exc:
            raise InvalidArgument(f"invalid {what} expression: {exc}") from None
        unknown = set(self._program.variables()) - _VARIABLES
        if unknown:
            raise InvalidArgument(f"invalid {what} expression: unknown variable(s) {', '.join(sorted(unknown))}; "
                                  f"use {', '.join(sorted(_VARIABLES))}")
        self._needs_value = "value" in self._program.variables()
        self.expression = expression

    def evaluate(self, record: common_pb2.Record) -> Any:
        """The expression's value for ``record``; raises whatever CEL raises on an evaluation error."""
        activation: dict[str, Any] = {
            "key": record.key if record.HasField("key") else None,
            "headers": dict(record.headers),
            "op": _OPS.get(record.op, "insert"),
            "partition": record.partition,
            "timestamp_ms": record.timestamp_ms,
        }
        if self._needs_value:
            try:
                activation["value"] = json.loads(record.value)
            except (json.JSONDecodeError, UnicodeDecodeError):
                activation["value"] = record.value
        return self._program.execute(activation)


class RecordFilter(RecordExpression):
    """A filter: a record matches when the expression is ``true``."""

    def matches(self, record: common_pb2.Record) -> bool:
        try:
            return self.evaluate(record) is True
        except Exception:  # noqa: BLE001 - CEL evaluation errors (missing field, type) mean "no match"
            return False
