"""What an audit of the HTTP gateway found, each case through a real 3-node cluster and a real HTTP
client; every one of them failed before its fix:

- a lone UTF-16 surrogate escape in a publish was a bare 500, and a stored value whose JSON text held
  one (published through gRPC) failed every page, SSE stream and claim that reached it, the claim
  after leasing everything it read;
- ``from=²`` was a 500, and ``from=١`` read from offset 1;
- integer fields took ``true``, ``"3"`` and ``1.0``: ``{"before_offset": true}`` pruned a record;
- unknown query parameters were ignored: ``filter=...`` returned every record;
- an SSE stream that failed ended with an ``error`` event carrying only a detail;
- connections that never finished a request head, or a body, stayed open for good: enough of them
  took the node to its open-file limit, gRPC included.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import jsonschema_rs
import pytest

from broker.client import Client
from broker.devcluster import DevCluster
from broker.http.guard import HttpLimits
from broker.http.server import start_in_thread
from tests.conftest import wait_until
from tests.http.conftest import gateway_up, sse_events

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def gateway(c: DevCluster) -> httpx.Client:
    leader = c.leader()
    assert leader is not None
    return httpx.Client(base_url=f"http://{c.http_address(leader)}", timeout=30)


def problem(r: httpx.Response, status: int, reason: str) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = r.json()
    assert body["status"] == status and body["reason"] == reason and body["detail"], body
    return body


def test_lone_surrogates_are_refused_and_a_stored_one_reads_as_text(http_cluster: DevCluster) -> None:
    with gateway(http_cluster) as g:
        assert g.put("/v1/topics/x-sur", json={}).status_code == 201
        for record in ('{"value":"\\ud800"}', '{"value":{"a":["\\udc00"]}}', '{"value":"a","key":"\\ud800"}',
                       '{"value":"a","headers":{"\\ud800":"v"}}', '{"value":"a","idempotency_key":"\\udfff"}'):
            body = f'{{"records":[{record}]}}'
            refused = problem(g.post("/v1/topics/x-sur/records", content=body,
                                     headers={"content-type": "application/json"}), 400, "INVALID_JSON")
            assert "lone UTF-16 surrogate" in str(refused["detail"]), refused
        paired = g.post("/v1/topics/x-sur/records", content='{"records":[{"value":"\\ud83d\\ude00"}]}',
                        headers={"content-type": "application/json"})
        assert paired.status_code == 200, paired.text
        with Client(http_cluster.addresses) as client:  # what gRPC stores as it is: JSON text with the escape
            client.publish("x-sur", b'"\\ud800"')
            client.publish("x-sur", b'"after"')
        page = g.get("/v1/topics/x-sur/records", params={"from": "earliest"})
        assert page.status_code == 200, page.text
        assert [r["value"] for r in page.json()["records"]] == ["\U0001f600", '"\\ud800"', "after"]
        with g.stream("GET", "/v1/topics/x-sur/watch", params={"from": "earliest"}) as stream:
            values = []
            for event in sse_events(stream.iter_lines()):
                if event.event == "record":
                    values.append(json.loads(event.data)["value"])
                if len(values) == 3:
                    break
        assert values[1:] == ['"\\ud800"', "after"]
        claimed = g.post("/v1/topics/x-sur/groups/w/claim", json={"max": 10, "visibility_ms": 60_000})
        assert claimed.status_code == 200 and len(claimed.json()["messages"]) == 3, claimed.text


def test_numbers_are_ascii_digits_and_integers_are_json_integers(http_cluster: DevCluster) -> None:
    with gateway(http_cluster) as g:
        g.put("/v1/topics/x-lax", json={})
        g.post("/v1/topics/x-lax/records", json={"records": [{"value": i} for i in range(3)]})
        for start in ("\u00b2", "\u0661", "1\u0661"):
            problem(g.get("/v1/topics/x-lax/records", params={"from": start}), 400, "INVALID_ARGUMENT")
        for body in ({"before_offset": True}, {"before_offset": "2"}, {"before_offset": 2.0},
                     {"before_offset": 2, "partition": False}):
            problem(g.post("/v1/topics/x-lax/prune", json=body), 400, "INVALID_ARGUMENT")
        assert g.get("/v1/topics/x-lax").json()["partitions"][0]["start_offset"] == 0, "nothing was pruned"
        problem(g.put("/v1/topics/x-lax3", json={"partitions": "3"}), 400, "INVALID_ARGUMENT")
        problem(g.post("/v1/topics/x-lax/groups/w/claim", json={"max": "2"}), 400, "INVALID_ARGUMENT")
        assert g.get("/v1/topics/x-lax3").status_code == 404


def test_unknown_query_parameters_are_refused(http_cluster: DevCluster) -> None:
    with gateway(http_cluster) as g:
        g.put("/v1/topics/x-query", json={"partitions": 2})
        for params in ({"partiton": "1"}, {"filter": 'value.t == "a"'}):
            refused = problem(g.get("/v1/topics/x-query/records", params=params), 400, "INVALID_ARGUMENT")
            assert "unknown query parameter" in str(refused["detail"]) and "from" in str(refused["detail"])
        problem(g.get("/v1/topics", params={"limit": "5"}), 400, "INVALID_ARGUMENT")
        assert g.get("/v1/topics/x-query/records", params={"partition": "1", "limit": "5"}).status_code == 200


def test_a_failed_stream_ends_with_the_problem_document(http_cluster: DevCluster) -> None:
    with gateway(http_cluster) as g:
        g.put("/v1/topics/x-drop", json={})
        with g.stream("GET", "/v1/topics/x-drop/watch", params={"from": "earliest", "heartbeat_ms": "200"}) as stream:
            lines = stream.iter_lines()
            assert next(lines) == ": connected"
            assert g.delete("/v1/topics/x-drop").status_code == 204
            failed = next(e for e in sse_events(lines) if e.event == "error")
        error = json.loads(failed.data)
        assert (error["status"], error["reason"], error["grpc_code"]) == (404, "TOPIC_NOT_FOUND", "NOT_FOUND"), error


def test_connections_that_never_send_a_whole_request_are_closed_and_capped(http_cluster: DevCluster) -> None:
    leader = http_cluster.leader()
    assert leader is not None
    host, port = http_cluster.http_address(leader).rsplit(":", 1)

    def connect(first: bytes) -> socket.socket:
        sock = socket.create_connection((host, int(port)), timeout=30)
        if first:
            sock.sendall(first)
        return sock

    def closed(sock: socket.socket) -> bool:
        sock.settimeout(0.05)
        try:
            return sock.recv(1024) == b""
        except TimeoutError:
            return False
        except OSError:
            return True

    bad = connect(b"POST /v1/topics/x-bad/records HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n")
    answer = b""
    while chunk := bad.recv(4096):
        answer += chunk
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/problem+json" in head, answer
    assert json.loads(content)["reason"] == "INVALID_HTTP", content
    bad.close()
    idle = connect(b"")
    half = connect(b"GET /v1/topics HTTP/1.1\r\nHost: x\r\n")
    body = connect(b"POST /v1/topics/x-body/records HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 100\r\n\r\n{")
    started = time.monotonic()
    half.sendall(b"X-Trickle: 1\r\n")  # bytes that trickle in do not move the deadline
    wait_until(lambda: closed(idle) and closed(half), 30, "the connections without a request head to be closed")
    assert time.monotonic() - started < 25
    wait_until(lambda: closed(body), 60, "a connection whose body stopped to be closed")
    # a flood of idle connections: the oldest go, a real request gets through, and a client keeping its
    # connection alive between two requests keeps it (it was the oldest, so it went first)
    kept = connect(b"")

    def ask(sock: socket.socket) -> bytes:
        sock.sendall(b"GET /v1/topics HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(30)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, "the kept-alive client's connection was closed"
            answer += chunk
        head, _, content = answer.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(content) < length:
            chunk = sock.recv(4096)
            assert chunk, "the connection was closed in the middle of an answer"
            content += chunk
        return head

    assert ask(kept).startswith(b"HTTP/1.1 200")
    flood = [connect(b"") for _ in range(1100)]
    try:
        with gateway(http_cluster) as g:
            assert g.get("/v1/topics").status_code == 200
        assert sum(closed(sock) for sock in flood[:100]) >= 70
        assert ask(kept).startswith(b"HTTP/1.1 200")
    finally:
        for sock in flood + [idle, half, body, kept]:
            sock.close()


def test_the_openapi_document_says_what_the_gateway_answers(http_cluster: DevCluster) -> None:
    """It listed a 422 HTTPValidationError for every operation (the gateway never sends one: a bad
    body is a 400 problem), no other error, a 200 for a create that answers 201, and every integer
    bound as a float (2**63 - 1 as 9.223372036854776e+18, which is 2**63)."""
    with gateway(http_cluster) as g:
        doc = g.get("/openapi.json").json()
        schemas = doc["components"]["schemas"]
        assert "HTTPValidationError" not in schemas and "Problem" in schemas
        for path, operations in doc["paths"].items():
            for method, operation in operations.items():
                responses = operation["responses"]
                assert "422" not in responses, (path, method)
                assert responses["400"]["content"]["application/problem+json"]["schema"] == {
                    "$ref": "#/components/schemas/Problem"}, (path, method)
        assert {"200", "201"} <= set(doc["paths"]["/v1/topics/{topic}"]["put"]["responses"])
        bound = schemas["PruneBody"]["properties"]["before_offset"]["anyOf"][0]["maximum"]
        assert bound == 2**63 - 1 and isinstance(bound, int)
        refused = g.post("/v1/topics/x-doc/prune", json={"before_offset": "1"})
        validator = jsonschema_rs.validator_for(schemas["Problem"])
        assert refused.status_code == 400 and validator.is_valid(refused.json()), refused.text
        assert g.put("/v1/topics/x-doc", json={}).status_code == 201
        slash = g.post("/v1/topics/x-doc/records/", json={"records": [{"value": 1}]})
        problem(slash, 404, "NOT_FOUND")  # not a 307 that a POST without -L does not follow


def test_live_watches_are_capped_below_the_connection_cap(http_cluster: DevCluster) -> None:
    """1,024 watches held open by one caller took every connection of the node's gateway: each new
    client was reset at once. Watches now have a cap of their own (here 2, on a gateway of this
    test's own), and the ones past it get a 503 problem document."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    gateway_ = start_in_thread(address, http_cluster.addresses, limits=HttpLimits(connections_max=8, watches_max=2))
    try:
        wait_until(lambda: gateway_up(address), 30, "the gateway")
        with httpx.Client(base_url=f"http://{address}", timeout=30) as g:
            assert g.put("/v1/topics/x-watch", json={}).status_code in (200, 201)
            params: dict[str, str | int] = {"from": "latest", "heartbeat_ms": 200}
            with g.stream("GET", "/v1/topics/x-watch/watch", params=params) as first, \
                    g.stream("GET", "/v1/topics/x-watch/watch", params=params) as second:
                assert first.status_code == second.status_code == 200
                problem(g.get("/v1/topics/x-watch/watch", params=params), 503, "WATCHES_FULL")
                assert g.get("/v1/cluster").status_code == 200, "other requests are served"

            def watch_again() -> bool:  # the two ended: their places are free again once the gateway sees it
                with g.stream("GET", "/v1/topics/x-watch/watch", params=params) as again:
                    return again.status_code == 200

            wait_until(watch_again, 20, "a watch again", interval_s=0.5)
    finally:
        assert gateway_.stop()
