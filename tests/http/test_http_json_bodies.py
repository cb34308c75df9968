"""The gateway's reading of JSON bodies and values, driven in process (no cluster): an SDK stand-in
records what the gateway would send, so a refusal is proved to reach no gRPC call."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from broker.client import errors
from broker.client.models import OutgoingRecord, Record
from broker.http import codec, problems, strict_json
from broker.http.app import create_app

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class RecordingClient:
    """Stands in for the SDK's ``AsyncClient``: keeps the calls the gateway makes."""

    def __init__(self) -> None:
        self.published: list[list[OutgoingRecord]] = []
        self.settled: list[list[bytes]] = []

    async def publish_batch(self, topic: str, records: Sequence[OutgoingRecord]) -> list[SimpleNamespace]:
        self.published.append(list(records))
        return [SimpleNamespace(partition=0, offset=i, duplicate=False, timestamp_ms=1) for i in range(len(records))]

    async def settle(self, verb: str, topic: str, group: str, positions: Sequence[bytes], **_: Any) -> list[int]:
        self.settled.append(list(positions))
        return [1] * len(positions)


def call(method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, RecordingClient]:
    """One request to a gateway whose SDK is a :class:`RecordingClient`."""
    app = create_app(["127.0.0.1:1"])
    sdk = RecordingClient()
    app.state.client = sdk

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as h:
            return await h.request(method, path, **kwargs)

    return asyncio.run(go()), sdk


def problem(r: httpx.Response, status: int, reason: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["reason"] == reason, body
    assert body["type"] == f"https://raftbroker.dev/problems/{reason.lower()}", body
    return str(body["detail"])


def publish_text(text: str) -> tuple[httpx.Response, RecordingClient]:
    return call("POST", "/v1/topics/t/records", content=text, headers={"content-type": "application/json"})


@pytest.mark.parametrize(("records", "where", "token"), [
    ('[{"value":NaN}]', "body.records[0].value", "NaN"),
    ('[{"value":1},{"value":Infinity}]', "body.records[1].value", "Infinity"),
    ('[{"value":-Infinity}]', "body.records[0].value", "-Infinity"),
    ('[{"value":"ok"},{"value":"ok"},{"value":[1.5,NaN]}]', "body.records[2].value[1]", "NaN"),
    ('[{"value":{"x":NaN}}]', "body.records[0].value.x", "NaN"),
])
def test_nan_and_infinity_are_refused_naming_the_record(records: str, where: str, token: str) -> None:
    """Before: 200, stored as the bytes NaN, Infinity, [1.5,NaN] (read back as null)."""
    r, sdk = publish_text(f'{{"records":{records}}}')
    detail = problem(r, 400, strict_json.NOT_JSON)
    assert detail.startswith(f"{where}: {token} is not JSON") and "RFC 8259" in detail, detail
    assert sdk.published == [], "nothing reached the cluster"


def test_a_number_beyond_a_double_is_refused_not_stored_as_infinity() -> None:
    r, sdk = publish_text('{"records":[{"value":[1e999]}]}')
    detail = problem(r, 400, strict_json.NOT_JSON)
    assert detail.startswith("body.records[0].value[0]: the number 1e999 is out of the range of a double"), detail
    assert sdk.published == []


def test_deep_nesting_and_overlong_numbers_say_what_is_wrong() -> None:
    """Before: 400 HTTP_ERROR "There was an error parsing the body" for both."""
    deep = "[" * 5000 + "]" * 5000
    detail = problem(publish_text(f'{{"records":[{{"value":{deep}}}]}}')[0], 400, strict_json.TOO_DEEP)
    assert f"nested more than {strict_json.DEPTH_MAX} levels deep" in detail, detail
    just_over = "[" * (strict_json.DEPTH_MAX - 2) + "]" * (strict_json.DEPTH_MAX - 2)  # + 3 levels of body
    problem(publish_text(f'{{"records":[{{"value":{just_over}}}]}}')[0], 400, strict_json.TOO_DEEP)
    within = "[" * (strict_json.DEPTH_MAX - 3) + "]" * (strict_json.DEPTH_MAX - 3)
    r, sdk = publish_text(f'{{"records":[{{"value":{within}}}]}}')
    assert r.status_code == 200, r.text
    assert sdk.published[0][0].value == within.encode()
    long_number = "9" * 5000
    r, sdk = publish_text(f'{{"records":[{{"value":{long_number}}}]}}')
    detail = problem(r, 400, strict_json.NUMBER_TOO_LONG)
    assert detail.startswith("body.records[0].value: a number of 5000 characters is longer than the limit of "
                             f"{strict_json.NUMBER_CHARS_MAX}"), detail
    assert sdk.published == []


def test_a_syntax_error_says_where() -> None:
    detail = problem(publish_text('{"records": [')[0], 400, strict_json.NOT_JSON)
    assert detail.startswith("body is not JSON: Expecting value (line 1, column 14)"), detail


@pytest.mark.parametrize("headers", [{}, {"content-type": "text/plain"},
                                     {"content-type": "application/x-www-form-urlencoded"}])
def test_a_body_that_is_not_application_json_is_415_saying_so(headers: dict[str, str]) -> None:
    """Before: 400 "body: Input should be a valid dictionary"."""
    r, sdk = call("POST", "/v1/topics/t/records", content=b'{"records":[{"value":1}]}', headers=headers)
    detail = problem(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert "must be JSON, sent with content-type: application/json" in detail, detail
    assert headers.get("content-type", "no content-type") in detail, detail
    assert sdk.published == []
    r, _ = call("POST", "/v1/topics/t/groups/g/ack", content=b'{"receipts":["AA"]}', headers=headers)
    problem(r, 415, "UNSUPPORTED_MEDIA_TYPE")


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "application/vnd.example+json"])
def test_json_content_types_are_taken(content_type: str) -> None:
    r, sdk = call("POST", "/v1/topics/t/records", content=b'{"records":[{"value":1}]}',
                  headers={"content-type": content_type})
    assert r.status_code == 200, r.text
    assert [x.value for x in sdk.published[0]] == [b"1"]


def test_a_null_value_is_stored_as_json_null() -> None:
    """null is a JSON document: stored as its text (before: "value ... is required")."""
    r, sdk = call("POST", "/v1/topics/t/records", json={"records": [{"value": None}, {"value": None,
                                                                                        "value_b64": "AP8="}]})
    assert r.status_code == 200, r.text
    assert [x.value for x in sdk.published[0]] == [b"null", b"\x00\xff"], "beside value_b64 a null counts as absent"
    detail = problem(call("POST", "/v1/topics/t/records", json={"records": [{"key": "k"}]})[0], 400,
                     "INVALID_ARGUMENT")
    assert detail == "record 0: value (JSON) or value_b64 (base64) is required", detail


@pytest.mark.parametrize("receipt", ["!!!", "", "a", "a b", "AA=A", "AAAA+/"])
def test_a_receipt_that_is_not_base64url_is_refused_as_not_a_receipt(receipt: str) -> None:
    """Before: "!!!" decoded to no bytes, and the node answered "position token must be 17 bytes, got 0"."""
    for verb in ("ack", "nack", "extend"):
        r, sdk = call("POST", f"/v1/topics/t/groups/g/{verb}", json={"receipts": ["AAAA", receipt]})
        detail = problem(r, 400, "INVALID_ARGUMENT")
        assert detail.startswith("receipt 1 is not a receipt of this API"), detail
        assert sdk.settled == []


def test_a_stored_value_that_is_not_json_reads_as_its_text_never_as_null() -> None:
    """Before: NaN, Infinity, -Infinity read as null and [1.5,NaN] as [1.5,null]."""
    for stored in (b"NaN", b"Infinity", b"-Infinity", b"[1.5,NaN]", b'{"x":NaN}', b"1e999",
                   b"[" * 300 + b"]" * 300, b"1" * 5000):
        assert codec.shown_value(stored) == stored.decode(), stored[:20]
        record = Record("t", 0, 0, None, stored, {}, 1, b"\x01")
        shown = codec.record_json(record)
        assert shown["value"] == stored.decode() and base64.b64decode(shown["value_b64"]) == stored
        json.loads(codec.json_text(shown))  # the SSE data line is JSON too
    assert codec.shown_value(b"null") is None and codec.shown_value(b"[1.5,2]") == [1.5, 2]
    assert codec.shown_value(b"\xff") is None, "not UTF-8: value_b64 only, as documented"


def test_a_record_over_the_services_limit_is_the_same_413_problem_as_the_others() -> None:
    """Before: status 413 with type .../invalid_argument and title "Invalid argument"."""
    err = errors.InvalidArgument("INVALID_ARGUMENT", "record 0 is 2097166 bytes, over the limit of 1048576 bytes")
    body = json.loads(bytes(problems.from_error(err).body))
    assert body == {"type": "https://raftbroker.dev/problems/request_too_large", "title": "Request too large",
                    "status": 413, "detail": "record 0 is 2097166 bytes, over the limit of 1048576 bytes",
                    "reason": "REQUEST_TOO_LARGE", "grpc_code": "INVALID_ARGUMENT", "limit_bytes": 1048576}
    batch = errors.InvalidArgument("INVALID_ARGUMENT", "batch of 9000000 bytes is over the limit of 8388608 bytes")
    assert json.loads(bytes(problems.from_error(batch).body))["limit_bytes"] == 8388608


def documented_endpoints() -> set[tuple[str, str]]:
    """(method, path) of every full ``/v1/...`` path in docs/http.md's endpoint table."""
    docs = (Path(__file__).parents[2] / "docs" / "http.md").read_text()
    start = docs.index("| | |")
    table = docs[start:docs.index("\n\n", start)]
    found: set[tuple[str, str]] = set()
    for methods, path in re.findall(r"`((?:[A-Z]+/)*[A-Z]+) (/v1/[^`?\s]*)", table):
        optional = re.fullmatch(r"(.*)\[(.*)\]", path)
        paths = [optional[1], optional[1] + optional[2]] if optional else [path]
        found |= {(m, p) for m in methods.split("/") for p in paths}
    return found


def test_the_documented_endpoints_are_routes_of_the_app() -> None:
    """Before: the docs listed GET/DELETE .../watermarks[/{dedup_id}], two of which answered 405."""
    app = create_app(["127.0.0.1:1"])
    routes = {(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods or ()}
    documented = documented_endpoints()
    assert ("GET", "/v1/topics/{topic}/watermarks") in documented and len(documented) >= 10, documented
    assert documented <= routes, documented - routes


def test_an_extend_longer_than_the_longest_lease_is_refused_naming_the_body_field() -> None:
    """Before: "extend_ms must be between 0 and 43200000", a name the body does not have."""
    r, sdk = call("POST", "/v1/topics/t/groups/g/extend", json={"receipts": ["AAAA"], "ms": 43_200_001})
    detail = problem(r, 400, "INVALID_ARGUMENT")
    assert detail == "body.ms (the leases' new length) must be between 1 and 43200000, got 43200001", detail
    assert sdk.settled == []
    r, sdk = call("POST", "/v1/topics/t/groups/g/extend", json={"receipts": ["AAAA"], "ms": 43_200_000})
    assert r.status_code == 200, r.text
