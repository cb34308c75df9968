"""JSON as RFC 8259 defines it, with limits: the gateway's only JSON parser, for bodies and values.

Python's ``json.loads`` takes more than JSON and less than a body may hold: it accepts ``NaN``,
``Infinity`` and ``-Infinity`` (and turns ``1e999`` into infinity), which were then stored as
bytes no JSON reader takes; it fails on deep nesting with a RecursionError and on integers past
4,300 digits with a ValueError, both of which left the client a bare "error parsing the body".
:func:`parse` refuses all of them, each with its own reason and a detail saying where:

- ``NaN``/``Infinity``/a number out of a double's range: :data:`NOT_JSON` ("records[1].value[1]:
  NaN is not JSON ..."), like any syntax error;
- a string (or a member name) holding a lone UTF-16 surrogate (``"\\ud800"``, which RFC 8259
  §8.2 allows in the syntax and leaves unpredictable): :data:`NOT_JSON` too. No UTF-8 text carries
  it: Python's parser made a string that failed every later ``encode`` as a bare 500, and a value
  stored through gRPC with that text, read back parsed, failed every page, stream and claim past it;
- more than :data:`DEPTH_MAX` nested arrays and objects: :data:`TOO_DEEP`;
- a number of more than :data:`NUMBER_CHARS_MAX` characters: :data:`NUMBER_TOO_LONG`.

Pure functions, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, NoReturn

# Nested arrays and objects in one document. RFC 8259 §9 lets a parser set it. 128 leaves a record
# value 125 levels inside a publish body, keeps the C parser and encoder (which recurse once per level)
# well clear of the interpreter's recursion limit (1,000), and a value read back within what the
# answer's serializer takes (pydantic-core stops at 255 levels: a deeper value was a 500).
DEPTH_MAX = 128
# Characters in one number (digits, sign, point, exponent). Python's int() stops at 4,300 digits;
# 1,000 is past any integer or double anyone sends (a double has 17 significant digits).
NUMBER_CHARS_MAX = 1000

NOT_JSON = "INVALID_JSON"
TOO_DEEP = "JSON_TOO_DEEP"
NUMBER_TOO_LONG = "JSON_NUMBER_TOO_LONG"


class NotJson(ValueError):
    """Text that is not JSON this API takes; ``reason`` says which rule it breaks, ``detail`` where."""

    def __init__(self, detail: str, reason: str) -> None:
        super().__init__(detail)
        self.detail = detail
        self.reason = reason


@dataclass(frozen=True)
class _Refused:
    """Stands for a refused token while :func:`_locate` looks for where it is."""

    detail: str
    reason: str


class _Found(Exception):
    """Raised by the parse hooks on the first refused token (the fast path stops there)."""


def _constant(name: str) -> _Refused:
    return _Refused(f"{name} is not JSON (RFC 8259 has no NaN or Infinity): send a number, a string or null",
                    NOT_JSON)


def _int(text: str) -> int | _Refused:
    if len(text) > NUMBER_CHARS_MAX:
        return _Refused(f"a number of {len(text)} characters is longer than the limit of {NUMBER_CHARS_MAX}",
                        NUMBER_TOO_LONG)
    return int(text)


def _float(text: str) -> float | _Refused:
    if len(text) > NUMBER_CHARS_MAX:
        return _Refused(f"a number of {len(text)} characters is longer than the limit of {NUMBER_CHARS_MAX}",
                        NUMBER_TOO_LONG)
    number = float(text)
    if not math.isfinite(number):
        return _Refused(f"the number {text} is out of the range of a double (JSON numbers here are finite)",
                        NOT_JSON)
    return number


def _raising(hook: Any) -> Any:
    def strict(text: str) -> Any:
        value = hook(text)
        if isinstance(value, _Refused):
            raise _Found
        return value
    return strict


_STRICT = json.JSONDecoder(parse_constant=_raising(_constant), parse_int=_raising(_int),
                           parse_float=_raising(_float))
_MARKING = json.JSONDecoder(parse_constant=_constant, parse_int=_int, parse_float=_float)


def _too_deep(name: str) -> NoReturn:
    raise NotJson(f"{name} is nested more than {DEPTH_MAX} levels deep (arrays and objects within each other)",
                  TOO_DEEP)


def _deeper_than(value: Any, depth_max: int) -> bool:
    """True when ``value`` has more than ``depth_max`` arrays/objects within each other (no recursion)."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > depth_max:
            return True
        inner: list[Any] = []
        for v in level:
            inner.extend(c for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, dict | list))
        level = inner
    return False


def _locate(value: Any, root: str) -> tuple[str, _Refused] | None:
    """The path of the first refused token in ``value`` (``body.records[1].value``), and it."""
    stack: list[tuple[str, Any]] = [(root, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, _Refused):
            return where, v
        if isinstance(v, dict):
            stack.extend((f"{where}.{k}" if where else str(k), c) for k, c in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", c) for i, c in reversed(list(enumerate(v))))
    return None


# an escape that can stand for a lone surrogate; a valid pair is decoded to one character
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any, root: str) -> str | None:
    """The path of the first string or member name in ``value`` that is no UTF-8 text, or None."""
    stack: list[tuple[str, Any]] = [(root, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode()
                except UnicodeEncodeError:
                    return where
        elif isinstance(v, dict):
            for k, c in v.items():
                child = f"{where}.{k}" if where else str(k)
                try:
                    k.encode()
                except UnicodeEncodeError:
                    return f"{where or 'the document'}: a member name"
                stack.append((child, c))
        elif isinstance(v, list):
            stack.extend((f"{where}[{i}]", c) for i, c in enumerate(v))
    return None


def _decode(decoder: json.JSONDecoder, text: str, name: str) -> Any:
    try:
        return decoder.decode(text)
    except RecursionError:  # the C parser recurses once per level
        _too_deep(name)
    except json.JSONDecodeError as err:
        raise NotJson(f"{name} is not JSON: {err.msg} (line {err.lineno}, column {err.colno})", NOT_JSON) from None


def parse(text: str | bytes, root: str = "") -> Any:
    """The JSON value of ``text`` (UTF-8 when bytes). Raises :class:`NotJson` for anything RFC 8259
    does not call JSON, or past the limits (see the module), naming where in the document it is
    (a path from ``root``, the document's name: ``body.records[1].value``)."""
    name = root or "the document"
    try:
        decoded = text.decode() if isinstance(text, bytes) else text
    except UnicodeDecodeError as err:
        raise NotJson(f"{name} is not UTF-8 text (byte {err.start})", NOT_JSON) from None
    try:
        value = _decode(_STRICT, decoded, name)
    except _Found:
        found = _locate(_decode(_MARKING, decoded, name), root)
        assert found is not None, "the marking parse finds what the strict one refused"
        where, refused = found
        raise NotJson(f"{where or name}: {refused.detail}", refused.reason) from None
    if _deeper_than(value, DEPTH_MAX):
        _too_deep(name)
    if _SURROGATE_ESCAPE.search(decoded) is not None:
        lone = _lone_surrogate(value, root)
        if lone is not None:
            raise NotJson(f"{lone or name}: a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff "
                          "unpaired), which no UTF-8 text can carry", NOT_JSON)
    return value
