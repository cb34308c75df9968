"""Schemas cannot reach outside themselves and every schema, value and name is bounded (issue 11 item 3).

Through the real gRPC API against a real 3-node cluster: a ``$ref`` to a local file or to a URL is
refused without reading or fetching it, oversize and deep schemas and deep values are refused with
INVALID_ARGUMENT (not INTERNAL), a huge name is not quoted back whole, and ListTopics stays small
however many topics carry schemas.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from broker.devcluster import DevCluster
from broker.leader.schemas import LIMITS
from broker.v1 import admin_pb2, broker_pb2, routes_pb2
from tests.cluster.stubs import Stubs, refused, stubs

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def leader(cluster: DevCluster) -> Iterator[Stubs]:
    s = stubs(cluster.wait_ready())
    yield s
    s.close()


def create(s: Stubs, name: str, schema: str) -> Callable[[], object]:
    return lambda: s.admin.CreateTopic(admin_pb2.CreateTopicRequest(
        config=admin_pb2.TopicConfig(name=name, schema_json=schema)))


def topic_names(s: Stubs) -> set[str]:
    return {t.config.name for t in s.admin.ListTopics(admin_pb2.ListTopicsRequest()).topics}


def test_a_file_ref_is_refused_without_reading_the_file(leader: Stubs, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"db": {"password": "hunter2-s3cr3t"}}))
    schema = json.dumps({"$ref": f"file://{secret}#/db/password"})
    code, msg = refused(create(leader, "ref-file", schema))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, msg
    assert "hunter2" not in msg and "external reference" in msg
    assert "ref-file" not in topic_names(leader)


class _Counting(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        self.hits.append(self.path)
        body = json.dumps({"type": "integer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the http.server interface
        pass


def test_an_http_ref_is_refused_without_fetching_it(leader: Stubs) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/schema.json"
        for i, schema in enumerate([{"$ref": url}, {"properties": {"a": {"$ref": url + "#/x"}}},
                                    {"$id": url, "properties": {"a": {"$ref": "other.json"}}}]):
            code, msg = refused(create(leader, f"ref-http-{i}", json.dumps(schema)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT, msg
            assert "external reference" in msg
        assert _Counting.hits == []  # the leader asked for nothing
        assert not {n for n in topic_names(leader) if n.startswith("ref-http")}
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_ref_inside_the_schema_still_works(leader: Stubs) -> None:
    schema = {"$defs": {"n": {"type": "integer"}}, "properties": {"n": {"$ref": "#/$defs/n"}}}
    leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(
        config=admin_pb2.TopicConfig(name="ref-local", schema_json=json.dumps(schema))))
    ok = broker_pb2.PublishRequest(topic="ref-local", records=[broker_pb2.PublishRecord(value=b'{"n": 1}')])
    leader.broker.Publish(ok)
    bad = broker_pb2.PublishRequest(topic="ref-local", records=[broker_pb2.PublishRecord(value=b'{"n": "x"}')])
    code, msg = refused(lambda: leader.broker.Publish(bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "field n" in msg


def test_an_oversize_schema_is_refused_and_listing_stays_small(leader: Stubs) -> None:
    pad = "x" * LIMITS.schema_bytes_max
    code, msg = refused(create(leader, "huge-schema", json.dumps({"description": pad})))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "schema_bytes_max" in msg, msg
    assert len(msg) < 1000
    # Schemas at the limit: the listing leaves them out (has_schema says they exist), describe has them.
    almost = json.dumps({"type": "object", "description": "y" * (LIMITS.schema_bytes_max - 100)})
    for i in range(3):
        leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(
            config=admin_pb2.TopicConfig(name=f"big-schema-{i}", schema_json=almost)))
    listing = leader.admin.ListTopics(admin_pb2.ListTopicsRequest())
    big = [t for t in listing.topics if t.config.name.startswith("big-schema-")]
    assert len(big) == 3 and all(t.has_schema and not t.config.schema_json for t in big)
    assert listing.ByteSize() < 64 * 1024
    described = leader.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="big-schema-0"))
    assert described.has_schema and described.config.schema_json == almost


def test_a_deep_schema_is_invalid_argument_not_internal(leader: Stubs) -> None:
    for depth in (LIMITS.schema_depth_max + 1, 5000):
        schema = '{"items":' * depth + "{}" + "}" * depth
        code, msg = refused(create(leader, f"deep-schema-{depth}", schema))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "nested deeper" in msg, (code, msg)
    assert not {n for n in topic_names(leader) if n.startswith("deep-schema")}


def test_a_deep_or_ambiguous_json_value_is_invalid_argument_not_internal(leader: Stubs) -> None:
    leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(
        config=admin_pb2.TopicConfig(name="deep-values", schema_json='{"type": "array"}')))
    for depth in (LIMITS.json_value_depth_max + 1, 100_000):
        value = ("[" * depth + "]" * depth).encode()
        req = broker_pb2.PublishRequest(topic="deep-values", records=[broker_pb2.PublishRecord(value=value)])
        code, msg = refused(lambda: leader.broker.Publish(req))  # noqa: B023 - called at once
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "nested deeper" in msg, (code, msg[:200])
    repeated = b'[{"a": 1, "b": [{"c": 1, "c": 2}]}]'  # a member name twice: refused, whichever value a reader keeps
    code, msg = refused(lambda: leader.broker.Publish(broker_pb2.PublishRequest(
        topic="deep-values", records=[broker_pb2.PublishRecord(value=repeated)])))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "repeats the member name 'c'" in msg, (code, msg)
    shallow = ("[" * 10 + "]" * 10).encode()
    leader.broker.Publish(broker_pb2.PublishRequest(topic="deep-values",
                                                    records=[broker_pb2.PublishRecord(value=shallow)]))
    info = leader.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="deep-values"))
    assert sum(p.records for p in info.partitions) == 1


@pytest.mark.parametrize("size", [100_000, 4 << 20])
def test_a_huge_name_is_not_quoted_back_whole(leader: Stubs, size: int) -> None:
    name = "n" * size
    code, msg = refused(lambda: leader.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name=name)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and len(msg) < 1000, (code, len(msg))
    code, msg = refused(create(leader, name, ""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and len(msg) < 1000, (code, len(msg))
    assert str(size) in msg  # the length is said instead
    route = routes_pb2.CreateRouteRequest(config=routes_pb2.RouteConfig(name=name, source="a", target="b"))
    code, msg = refused(lambda: leader.admin.CreateRoute(route))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and len(msg) < 1000, (code, len(msg))


def leadership(s: Stubs) -> tuple[str, int]:
    status = s.admin.ClusterStatus(admin_pb2.ClusterStatusRequest())
    return status.leader_id, max(n.term for n in status.nodes)


def test_no_value_or_pattern_can_stall_the_leader(leader: Stubs) -> None:
    """Before the fix, one publish of a 200 KB string to a topic whose pattern backtracks took the
    leader, and each node it was retried on, for minutes: the cluster had no leader."""
    code, msg = refused(create(leader, "lookahead", json.dumps({"type": "string", "pattern": "(?=(a*)*$)x"})))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no lookaround or backreferences" in msg, msg
    before = leadership(leader)
    leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
        name="nested-pattern", schema_json=json.dumps({"type": "string", "pattern": "^(a+)+$"}))))
    big = json.dumps("a" * 900_000 + "!").encode()
    req = broker_pb2.PublishRequest(topic="nested-pattern", records=[broker_pb2.PublishRecord(value=big)])
    code, msg = refused(lambda: leader.broker.Publish(req, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "record 0: field (the document)" in msg, msg[:300]
    # a recursive schema whose branches both descend, and a value 120 deep that fits neither
    branching = {"$defs": {"a": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/a"}, "maxItems": 1},
                                           {"type": "array", "items": {"$ref": "#/$defs/a"}}]}}, "$ref": "#/$defs/a"}
    leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
        name="tree", schema_json=json.dumps(branching))))
    deep = ("[" * 120 + "0" + "]" * 120).encode()
    req = broker_pb2.PublishRequest(topic="tree", records=[broker_pb2.PublishRecord(value=deep)])
    code, msg = refused(lambda: leader.broker.Publish(req, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "does not satisfy the topic's schema" in msg, msg[:300]
    ok = ("[" * 120 + "]" * 120).encode()
    leader.broker.Publish(broker_pb2.PublishRequest(topic="tree", records=[broker_pb2.PublishRecord(value=ok)]))
    assert leadership(leader) == before  # the leader never stopped answering its followers
    info = leader.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="tree"))
    assert sum(p.records for p in info.partitions) == 1
