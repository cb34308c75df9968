"""Topic schemas (SPEC §2.3) and dedup fields (SPEC §4), checked on the leader before replication.

A schema is a JSON Schema; values of a topic with a schema must be JSON documents that validate.
A schema is self-contained: ``$ref`` resolves only inside the schema itself (never a file, a URL or
anything else outside it), and schemas and values are bounded in size and nesting depth
(:class:`SchemaLimits`), so no input can make the leader read, fetch or recurse without bound.

No value may cost the leader more than its size times its schema's, since the check holds the GIL
(jsonschema-rs does not release it) and a leader that stops for seconds loses its leadership:
- ``pattern`` and ``patternProperties`` run on the linear-time regex engine; lookaround and
  backreferences are refused at create (the backtracking engine took 8 s on a 100 KB string with
  ``(?=(a*)*$)x`` and ~20 minutes on 1 MB, and a retried publish then stalls each new leader);
- a schema whose references, expanded, hold more than ``schema_expanded_nodes_max`` nodes is
  refused at create: ``$ref`` is not memoized across a chain of definitions that each refer to
  the one before twice, so 24 of them made every valid value cost 0.4 s (and 40, hours). So
  references are ``#`` pointers or anchors into the schema itself, and nothing else;
- the check decides with ``is_valid`` (it stays linear on recursive schemas too) and only then
  looks for the field at fault. That search collects the errors of every branch of
  ``anyOf``/``oneOf``/``allOf``: on a recursive schema it is exponential in the value's depth (an
  array 17 deep took 18 s, 30 deep exhausted the memory). For a schema that refers to itself it
  runs in a helper process with a CPU budget (:mod:`broker.leader.schema_explain`); past the
  budget the record is still refused, with a message that says the field was not found.
Dedup fields name top-level JSON fields (dotted paths reach into objects) whose values together
form a permanent unique key of the topic; the leader extracts the key and the state machine
enforces uniqueness (see ``BrokerStateMachine``).
"""

from __future__ import annotations

import json
import math
import threading
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import jsonschema_rs

from broker.core.errors import FailedPrecondition, InvalidArgument, shown
from broker.leader import schema_explain

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
    schema_expanded_nodes_max: int = 100_000

    def __post_init__(self) -> None:
        assert 0 < self.schema_bytes_max <= 4 << 20, self.schema_bytes_max
        assert 0 < self.schema_depth_max <= 256, self.schema_depth_max
        assert 0 < self.json_value_depth_max <= 256, self.json_value_depth_max
        assert 0 < self.schema_expanded_nodes_max <= 10_000_000, self.schema_expanded_nodes_max


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


def _parse_bounded(text: str | bytes, depth_max: int, what: str, *, unique_names: bool = False) -> Any:
    """``json.loads`` that refuses documents nested deeper than ``depth_max``, and NaN, Infinity and
    numbers beyond a double (InvalidArgument): Python reads them, RFC 8259 has none of them, and a
    schema check then saw ``null`` ("null is not of type number") where the record held NaN.
    ``unique_names``: also refuse an object that repeats a member name. Python keeps the last one,
    so the schema checked it, while parsers that keep the first (RFC 8259 leaves it open) would
    read a value the schema never saw."""
    deep = InvalidArgument(f"{what} is nested deeper than {depth_max} levels")

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(pairs)
        if len(found) != len(pairs):
            seen: set[str] = set()
            for name, _ in pairs:
                if name in seen:
                    raise InvalidArgument(f"{what}: an object repeats the member name {shown(name)} (the schema "
                                          "would check only its last value)")
                seen.add(name)
        return found

    def constant(name: str) -> float:
        raise InvalidArgument(f"{what}: {name} is not JSON (RFC 8259 has no NaN or Infinity)")

    def finite(number: str) -> float:
        parsed = float(number)
        if math.isinf(parsed):
            raise InvalidArgument(f"{what}: the number {number[:40]} is beyond a double's range")
        return parsed

    try:
        document = json.loads(text, parse_constant=constant, parse_float=finite,
                              object_pairs_hook=members if unique_names else None)
    except RecursionError:
        raise deep from None
    # Counting brackets is cheap; only a document with many of them needs the walk.
    raw = text.encode() if isinstance(text, str) else text
    brackets = raw.count(b"[") + raw.count(b"{")
    if brackets > depth_max and json_depth(document, depth_max) > depth_max:
        raise deep
    return document


@dataclass(frozen=True)
class CompiledSchema:
    """A topic's validator; ``recursive``: some reference leads back to a schema that holds it."""

    validator: jsonschema_rs.Validator
    recursive: bool


# keywords whose values are JSON data, not schemas: a "$ref" key inside them is data
_DATA_KEYWORDS = frozenset({"const", "enum", "examples", "default"})


class _References:
    """The schema's subschemas by JSON pointer and anchor, and the expansion of its references."""

    def __init__(self, schema: Any, limits: SchemaLimits) -> None:
        self.limits = limits
        self.by_pointer: dict[str, Any] = {}
        self.anchors: dict[str, Any] = {}
        self.recursive = False
        stack: list[tuple[Any, str]] = [(schema, "")]
        while stack:
            node, pointer = stack.pop()
            self.by_pointer[pointer] = node  # a subschema may be a boolean: {"$defs": {"any": true}}
            if isinstance(node, dict):
                for keyword in ("$anchor", "$dynamicAnchor"):
                    if isinstance(node.get(keyword), str):
                        self.anchors[node[keyword]] = node
                for keyword in ("$dynamicRef", "$recursiveRef"):
                    if keyword in node:
                        raise InvalidArgument(f"schema at {shown(pointer or '/', quote=False)}: {keyword} is not "
                                              "supported; use $ref to a #/... pointer or a #name anchor")
                if pointer and isinstance(node.get("$id"), str):
                    raise InvalidArgument(f"schema at {shown(pointer, quote=False)}: $id is allowed only at the "
                                          "root (references resolve against the schema itself)")
                children: Iterable[tuple[str, Any]] = ((k, v) for k, v in node.items() if k not in _DATA_KEYWORDS)
            elif isinstance(node, list):
                children = ((str(i), v) for i, v in enumerate(node))
            else:
                continue
            for key, child in children:
                stack.append((child, f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}"))
        self._sizes: dict[int, int] = {}
        self._open: set[int] = set()

    def target(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise InvalidArgument(f"external reference refused: a schema may only refer to itself with a #/... "
                                  f"pointer or a #name anchor ({shown(ref)})")
        fragment = urllib.parse.unquote(ref[1:])
        pointer = not fragment or fragment.startswith("/")
        found = self.by_pointer.get(fragment, _MISSING) if pointer else self.anchors.get(fragment, _MISSING)
        if found is _MISSING:
            raise InvalidArgument(f"schema: $ref {shown(ref)} points at nothing in the schema")
        return found

    def expanded(self, node: Any) -> int:
        """Nodes under ``node`` with every reference replaced by what it points at (a reference
        back into a schema being expanded counts one: that is recursion, not repetition)."""
        key = id(node)
        size = self._sizes.get(key)
        if size is not None:
            return size
        if key in self._open:
            self.recursive = True
            return 1
        self._open.add(key)
        size = 1
        if isinstance(node, dict):
            for keyword, child in node.items():
                if keyword == "$ref" and isinstance(child, str):
                    size += self.expanded(self.target(child))
                elif keyword not in _DATA_KEYWORDS:
                    size += self.expanded(child)
                if size > self.limits.schema_expanded_nodes_max:
                    break
        elif isinstance(node, list):
            for child in node:
                size += self.expanded(child)
                if size > self.limits.schema_expanded_nodes_max:
                    break
        self._open.discard(key)
        self._sizes[key] = size
        return size


def compile_schema(schema_json: str, limits: SchemaLimits = LIMITS) -> CompiledSchema:
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
    references = _References(schema, limits)
    try:
        expanded = references.expanded(schema)
    except RecursionError:
        raise InvalidArgument("schema: its references lead through too many levels") from None
    if expanded > limits.schema_expanded_nodes_max:
        raise InvalidArgument(f"schema: with its references expanded it has more than "
                              f"{limits.schema_expanded_nodes_max} nodes (schema_expanded_nodes_max): every value "
                              "would cost that much to check")
    try:
        validator = jsonschema_rs.validator_for(schema, retriever=_refuse_external,
                                                pattern_options=jsonschema_rs.RegexOptions())
    except (jsonschema_rs.ValidationError, ValueError) as exc:
        first = shown(str(exc).splitlines()[0], quote=False, chars_max=400)
        hint = (" (patterns run on a linear-time engine: no lookaround or backreferences)"
                if 'is not a "regex"' in first else "")
        raise InvalidArgument(f"schema is not a valid JSON Schema: {first}{hint}") from None
    return CompiledSchema(validator, references.recursive)


def validate_dedup_fields(fields: list[str]) -> None:
    for field in fields:
        if not field or any(not part for part in field.split(".")):
            raise InvalidArgument(f"invalid dedup field {shown(field)}: use a field name or a dotted path")
    if len(set(fields)) != len(fields):
        raise InvalidArgument("dedup fields must not repeat")


def parse_json(index: int, value: bytes, limits: SchemaLimits = LIMITS) -> Any:
    """The JSON document in a record's value; InvalidArgument if it is not JSON or is too deep."""
    try:
        return _parse_bounded(value, limits.json_value_depth_max, f"record {index}: value", unique_names=True)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"record {index}: value is not valid JSON ({shown(str(exc), quote=False)})") from None


def first_error(validator: jsonschema_rs.Validator, document: Any) -> str | None:
    """The field at fault and the rule it breaks, or None if ``document`` is valid. On a recursive
    schema this can take exponential time: see the module docstring."""
    for error in validator.iter_errors(document):
        path = "/".join(str(p) for p in error.instance_path) or "(the document)"
        return f"field {shown(path, quote=False)}: {shown(error.message, quote=False)}"
    return None


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

    def __init__(self, explainer: schema_explain.SchemaExplainer | None = None) -> None:
        self._lock = threading.Lock()
        self._validators: dict[int, CompiledSchema] = {}
        self._explainer = explainer

    def get(self, topic_id: int, schema_json: str) -> CompiledSchema:
        with self._lock:
            compiled = self._validators.get(topic_id)
            if compiled is None:
                try:
                    compiled = self._validators[topic_id] = compile_schema(schema_json)
                except InvalidArgument as exc:  # stored by a version with looser rules
                    raise FailedPrecondition(
                        f"the topic's schema is refused by this version ({exc}); publishing to it needs the topic "
                        "re-created with a schema that is accepted") from None
            return compiled

    def check_documents(self, topic_id: int, schema_json: str, dedup_fields: Sequence[str],
                        values: Iterable[bytes]) -> list[str]:
        """Validate every value against the topic's schema (if any) and return the dedup-field key
        of each (empty without dedup fields); the first failure raises InvalidArgument naming the
        record index, so a batch is refused whole."""
        if not schema_json and not dedup_fields:
            return []
        compiled = self.get(topic_id, schema_json) if schema_json else None
        fields = list(dedup_fields)
        keys = []
        for i, value in enumerate(values):
            document = parse_json(i, value)
            try:
                valid = compiled is None or compiled.validator.is_valid(document)
            except UnicodeEncodeError:  # the validator takes text as UTF-8, which a lone surrogate is not
                raise InvalidArgument(f"record {i}: a string or member name holds a lone UTF-16 surrogate escape "
                                      "(\\ud800-\\udfff unpaired), which the schema cannot check as text") from None
            if not valid:
                assert compiled is not None
                raise InvalidArgument(f"record {i}: {self._explain(compiled, schema_json, value, document)}")
            if fields:
                keys.append(unique_key(i, document, fields))
        return keys

    def check_compile(self, schema_json: str) -> None:
        """Before a topic is created with ``schema_json``: compile it in the helper process, where
        its cost is measured and bounded (:meth:`SchemaExplainer.check_compile`), not here."""
        if self._explainer is None:
            self._explainer = schema_explain.shared()
        self._explainer.check_compile(schema_json)

    def _explain(self, compiled: CompiledSchema, schema_json: str, value: bytes, document: Any) -> str:
        if not compiled.recursive:  # bounded by the schema's size times the value's
            message = first_error(compiled.validator, document)
        else:
            if self._explainer is None:
                self._explainer = schema_explain.shared()
            message = self._explainer.explain(schema_json, value)
        return message or "the value does not satisfy the topic's schema"
