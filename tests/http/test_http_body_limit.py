"""Request size over HTTP through a real 3-node cluster: a body over the cap is refused unread (413),
a batch over the gRPC limits is a 413 in our words, never gRPC's transport text under a 429."""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from broker.client import Client
from broker.devcluster import DevCluster
from broker.http.body_limit import BODY_BYTES_MAX
from broker.limits import Limits
from tests.conftest import rss_bytes

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

CHUNK_BYTES = 64 * 1024
ANSWER_TIMEOUT_S = 30.0


def problem_413(status: int, content_type: str, body: dict[str, object], limit_bytes: int) -> str:
    """The detail of a 413 problem document naming ``limit_bytes`` and what to do."""
    assert status == 413, body
    assert content_type == "application/problem+json"
    assert body["status"] == 413 and body["reason"] == "REQUEST_TOO_LARGE" and body["limit_bytes"] == limit_bytes
    detail = str(body["detail"])
    assert str(limit_bytes) in detail and "split the batch" in detail, detail
    assert "larger than max" not in detail, "gRPC's transport text is not the answer"
    return detail


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, object]]:
    """One HTTP/1.1 response with a Content-Length body, read within the socket's timeout."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"the connection closed before an answer: {data!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        piece = sock.recv(65536)
        assert piece, "the connection closed inside the answer"
        body += piece
    return int(status_line.split()[1]), headers, json.loads(body)


def open_request(c: DevCluster, path: str, headers: dict[str, str]) -> socket.socket:
    """A connection to node 0's gateway that has sent a POST's head (and none of its body)."""
    host, port = c.http_address(0).rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    sock.sendall((head + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode())
    return sock



def gateway(c: DevCluster) -> httpx.Client:
    return httpx.Client(base_url=f"http://{c.http_address(0)}", timeout=60)


def b64_records(count: int, value_bytes: int) -> dict[str, object]:
    value = base64.b64encode(b"v" * value_bytes).decode()
    return {"records": [{"value_b64": value} for _ in range(count)]}


def test_a_content_length_over_the_cap_is_refused_before_the_body_is_sent(http_cluster: DevCluster) -> None:
    with open_request(http_cluster, "/v1/topics/b-any/records", {"Content-Length": str(BODY_BYTES_MAX + 1)}) as sock:
        sock.sendall(b'{"records": [')  # a few bytes of the body; the rest never comes
        status, headers, body = read_response(sock)
    detail = problem_413(status, headers["content-type"], body, BODY_BYTES_MAX)
    assert f"({BODY_BYTES_MAX + 1} bytes)" in detail, detail


def test_a_streamed_body_is_refused_once_it_passes_the_cap_not_at_its_end(http_cluster: DevCluster) -> None:
    """A chunked body with no length: the answer comes once cap + 1 bytes are in, while the body
    has not ended (a gateway waiting for its end would never answer)."""
    with open_request(http_cluster, "/v1/topics/b-any/records", {"Transfer-Encoding": "chunked"}) as sock:
        sent = 0
        while sent <= BODY_BYTES_MAX:
            piece = b"x" * min(CHUNK_BYTES, BODY_BYTES_MAX + 1 - sent)
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        assert sent == BODY_BYTES_MAX + 1  # and no last chunk: the body goes on
        status, headers, body = read_response(sock)
    problem_413(status, headers["content-type"], body, BODY_BYTES_MAX)


def test_a_client_streaming_a_large_body_gets_413_and_the_node_keeps_none_of_it(http_cluster: DevCluster) -> None:
    """An ordinary client sends its whole body before it reads: it still gets the 413 (not a reset),
    and the node's memory does not grow by the body's size (before, 150 MB took it 443 MB -> 2 GB)."""
    body_bytes = 6 * BODY_BYTES_MAX
    pid = http_cluster.pids[0]
    assert pid is not None
    before = rss_bytes(pid)

    def body() -> Iterator[bytes]:
        for _ in range(body_bytes // CHUNK_BYTES):
            yield b"x" * CHUNK_BYTES

    with gateway(http_cluster) as h:
        r = h.post("/v1/topics/b-any/records", content=body(), headers={"content-type": "application/json"})
        problem_413(r.status_code, r.headers["content-type"], r.json(), BODY_BYTES_MAX)
        grown = rss_bytes(pid) - before
        assert grown < body_bytes // 2, f"RSS grew by {grown} bytes for a body of {body_bytes}"
        assert h.get("/v1/topics").status_code == 200, "the connection and the gateway serve on"


def test_a_batch_within_the_cap_over_the_grpc_limits_is_413_in_our_words(http_cluster: DevCluster) -> None:
    """12 records of 900 KB: 14.4 MB of JSON (under the cap), 10.8 MB as one gRPC message (over the
    node's 9 MiB): before, 429 "SERVER: Received message larger than max", which a client retries
    forever. 9 records of 1 MB fit one message but not the 8 MiB batch: the services' own 413."""
    message_bytes_max = Limits().batch_bytes_max + (1 << 20)
    with gateway(http_cluster) as h, Client(http_cluster.addresses) as sync:
        assert h.put("/v1/topics/b-big", json={"partitions": 1}).status_code == 201
        over_message = json.dumps(b64_records(12, 900_000))
        assert len(over_message) < BODY_BYTES_MAX
        r = h.post("/v1/topics/b-big/records", content=over_message, headers={"content-type": "application/json"})
        detail = problem_413(r.status_code, r.headers["content-type"], r.json(), message_bytes_max)
        assert r.json()["grpc_code"] == "RESOURCE_EXHAUSTED" and "gRPC message" in detail, detail
        over_batch = h.post("/v1/topics/b-big/records", json=b64_records(9, 1_000_000))
        assert over_batch.status_code == 413, over_batch.text
        assert f"over the limit of {Limits().batch_bytes_max} bytes" in over_batch.json()["detail"]
        assert sync.describe_topic("b-big").partitions[0].records == 0, "nothing stored"


def test_the_largest_batch_grpc_accepts_and_a_normal_one_go_through_http(http_cluster: DevCluster) -> None:
    """8 records of 1,040,000 bytes (the 8 MiB batch limit, each under the 1 MiB record limit) are
    11 MB of JSON as value_b64: within the cap, stored; an ordinary small batch as well."""
    with gateway(http_cluster) as h:
        assert h.put("/v1/topics/b-ok", json={"partitions": 1}).status_code == 201
        largest = b64_records(8, 1_040_000)
        r = h.post("/v1/topics/b-ok/records", json=largest)
        assert r.status_code == 200, r.text
        assert [x["offset"] for x in r.json()["results"]] == list(range(8))
        r = h.post("/v1/topics/b-ok/records", json={"records": [{"value": {"n": i}} for i in range(3)]})
        assert r.status_code == 200, r.text
        assert [x["offset"] for x in r.json()["results"]] == [8, 9, 10]
        page = h.get("/v1/topics/b-ok/records", params={"from": "8"}).json()
        assert [x["value"] for x in page["records"]] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_a_full_topic_is_still_429(http_cluster: DevCluster) -> None:
    """Back-pressure keeps its 429 (with the services' own sentence): retrying later can succeed."""
    with gateway(http_cluster) as h:
        assert h.put("/v1/topics/b-full", json={"partitions": 1, "full_policy": "reject",
                                                "retention": {"max_records": 1}}).status_code == 201
        assert h.post("/v1/topics/b-full/records", json={"records": [{"value": "a"}]}).status_code == 200
        r = h.post("/v1/topics/b-full/records", json={"records": [{"value": "b"}]})
        assert r.status_code == 429 and r.headers["content-type"] == "application/problem+json", r.text
        assert r.json()["reason"] == "RESOURCE_EXHAUSTED" and "is full" in r.json()["detail"], r.text
