"""Translation between JSON bodies and the SDK's values: record values, position tokens, cursors.

Pure functions, no I/O. Anything malformed raises :class:`~broker.client.errors.InvalidArgument`
(answered 400), so a bad body changes nothing.

- A published ``value`` that is a JSON string is stored as its UTF-8 text; any other JSON value
  (``null`` too) is stored as its compact JSON text; ``value_b64`` (standard base64) stores raw bytes.
- A read record carries ``value`` (the stored bytes parsed as JSON when they are JSON by RFC 8259
  within :mod:`broker.http.strict_json`'s limits, else the UTF-8 text, else null) and always
  ``value_b64`` (the exact bytes). Bytes such as ``NaN`` or ``[1.5,NaN]`` (stored through gRPC, or
  by a gateway before it refused them) come back as their text, never as a parsed null.
- A position token (one record's place) travels as unpadded base64url (``receipt`` of a leased
  message); a cursor (where a read continues, one place per partition) likewise, over the JSON
  object ``{"<partition>": "<token>" or <offset>}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any

from broker.client.errors import invalid_argument
from broker.client.models import Event, Record
from broker.http import strict_json

CURSOR_CHARS_MAX = 64 * 1024
_B64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")


class Absent:
    """The ``value`` of a record that has none (distinct from JSON ``null``, which is a value)."""


ABSENT = Absent()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_bytes(text: str) -> bytes:
    """The bytes of unpadded base64url text; ValueError for anything else (before, the decoder
    dropped the characters outside the alphabet, so ``"!!!"`` read as no bytes at all)."""
    if not _B64URL.fullmatch(text):
        raise ValueError(f"not base64url: {text[:40]!r}")
    text = text.rstrip("=")  # padding is not sent, and taken
    if len(text) % 4 == 1:
        raise ValueError(f"not base64url: {text[:40]!r}")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def receipt(text: str, what: str) -> bytes:
    """The position token of a receipt (``receipt`` of a claimed message: unpadded base64url)."""
    try:
        token = b64url_bytes(text)
    except ValueError:  # binascii.Error too
        token = b""
    if not token:
        raise invalid_argument(f"{what} is not a receipt of this API (the receipt of a claimed message, unpadded "
                               f"base64url): {text[:40]!r}")
    return token


def stored_value(value: Any, value_b64: str | None, what: str) -> bytes:
    """The bytes to store for a record given as ``value`` (a JSON value, ``None`` for JSON null;
    :data:`ABSENT` when the record has none) or ``value_b64``. Beside ``value_b64``, a null
    ``value`` counts as absent (as a null does for every other optional field)."""
    if value_b64 is not None:
        if value is not None and value is not ABSENT:
            raise invalid_argument(f"{what}: give value or value_b64, not both")
        try:
            return base64.b64decode(value_b64, validate=True)
        except (binascii.Error, ValueError):
            raise invalid_argument(f"{what}: value_b64 is not base64") from None
    if value is ABSENT:
        raise invalid_argument(f"{what}: value (JSON) or value_b64 (base64) is required")
    if isinstance(value, str):
        return value.encode()
    try:  # the body was parsed by strict_json: no NaN or Infinity can be in it
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except ValueError:
        raise invalid_argument(f"{what}: NaN and Infinity are not JSON (RFC 8259)") from None


def shown_value(data: bytes) -> Any:
    """A stored value as JSON: parsed when it is JSON (RFC 8259, within strict_json's limits), else
    the text, else None (see value_b64). Never a null standing for a NaN it could not show."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return None
    try:
        return strict_json.parse(text)
    except strict_json.NotJson:
        return text


def record_json(record: Record) -> dict[str, Any]:
    key = record.key
    return {
        "partition": record.partition, "offset": record.offset, "timestamp_ms": record.timestamp_ms,
        "key": None if key is None else key.decode(errors="replace"),
        "key_b64": None if key is None else base64.b64encode(key).decode(),
        "value": shown_value(record.value), "value_b64": base64.b64encode(record.value).decode(),
        "headers": dict(record.headers), "op": record.op, "position": b64url(record.position),
    }


def event_json(event: Event) -> dict[str, Any]:
    return {"type": event.type, "partition": event.partition, "offset_before": event.offset_before,
            "offset_after": event.offset_after, "detail": event.detail}


Place = bytes | int  # a position token (right after that record) or an offset (at it)


def encode_cursor(places: Mapping[int, Place]) -> str:
    """A cursor over per-partition places (tokens, or offsets where no record was read yet)."""
    raw = {str(p): (t if isinstance(t, int) else b64url(t)) for p, t in sorted(places.items())}
    return b64url(json.dumps(raw, separators=(",", ":")).encode())


NOT_A_CURSOR = "not a cursor of this API (use the next value of a read, or an SSE event id)"


def decode_cursor(cursor: str, refusal: str = NOT_A_CURSOR) -> dict[int, Place]:
    """The per-partition places of a cursor made by :func:`encode_cursor`; ``refusal`` is the
    message for text that is none (it names where the text came from)."""
    if len(cursor) > CURSOR_CHARS_MAX:
        raise invalid_argument(f"a cursor has at most {CURSOR_CHARS_MAX} characters")
    try:
        raw = json.loads(b64url_bytes(cursor))
        if not isinstance(raw, dict):
            raise ValueError
        places: dict[int, Place] = {}
        for p, t in raw.items():
            if isinstance(t, bool) or not isinstance(t, int | str) or (isinstance(t, int) and not 0 <= t < 2**63):
                raise ValueError
            places[int(p)] = t if isinstance(t, int) else b64url_bytes(t)
    except (ValueError, TypeError):  # binascii.Error and UnicodeDecodeError too
        raise invalid_argument(refusal) from None
    if any(not 0 <= p < 2**31 for p in places):
        raise invalid_argument("not a cursor of this API (partition out of range)")
    return places


def json_text(body: object) -> str:
    """Compact JSON on one line (an SSE data field)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
