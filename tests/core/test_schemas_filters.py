"""Schemas, dedup fields and CEL filters in the core (SPEC §2.3, §3.4, §4)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from broker.clock import NodeClock
from broker.core import errors
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.reading import Reader
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.services import wire
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, common_pb2, internal_pb2
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit

VIDEO = json.dumps({"type": "object", "required": ["url"],
                    "properties": {"url": {"type": "string"}, "views": {"type": "integer", "minimum": 0}}})


@pytest.fixture
def env() -> Iterator[tuple[TopicLog, Reader]]:
    state = BrokerStateMachine(MemoryStore(), Changes())
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    yield TopicLog(state, submitter, Limits(), "c/n1", NodeClock()), Reader(state)
    replicator.close()


def docs(*values: object, **kw: object) -> list[broker_pb2.PublishRecord]:
    return [broker_pb2.PublishRecord(value=json.dumps(v).encode(), **kw) for v in values]  # type: ignore[arg-type]


def read(reader: Reader, topic: str, expr: str = "") -> list[common_pb2.Record]:
    out: list[common_pb2.Record] = []
    request = broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True, filter=expr)
    for item in reader.subscribe(wire.subscription(request), lambda: True):
        out.extend(item.batch.records)
    return out


def test_schema_rejects_a_bad_record_naming_index_and_field(env: tuple[TopicLog, Reader]) -> None:
    log, reader = env
    log.create_topic(internal_pb2.TopicConfig(name="videos", schema_json=VIDEO))
    log.publish(publish_request(topic="videos", records=docs({"url": "a"})))
    with pytest.raises(errors.InvalidArgument, match="record 1: field views"):
        log.publish(publish_request(topic="videos", records=docs({"url": "b"}, {"url": "c", "views": -1})))
    with pytest.raises(errors.InvalidArgument, match="record 0: value is not valid JSON"):
        log.publish(publish_request(topic="videos", records=[broker_pb2.PublishRecord(value=b"{nope")]))
    # Python's json reads these; RFC 8259 has none, and the schema check saw null where NaN was
    for text, said in ((b'{"url": "d", "views": NaN}', "record 0: value: NaN is not JSON"),
                       (b'{"url": "d", "views": -Infinity}', "record 0: value: -Infinity is not JSON"),
                       (b'{"url": "d", "views": 1e999}', "record 0: value: the number 1e999 is beyond a double"),
                       # the validator raised UnicodeEncodeError: an INTERNAL answer
                       (b'{"url": "d", "\\udfff": 1}', "record 0: a string or member name holds a lone UTF-16"),
                       # Python keeps the last "views" (valid); a parser keeping the first reads -1
                       (b'{"url": "d", "views": -1, "views": 5}', "record 0: value: an object repeats the member "
                                                                  "name 'views'")):
        with pytest.raises(errors.InvalidArgument, match=said):
            log.publish(publish_request(topic="videos", records=[broker_pb2.PublishRecord(value=text)]))
    assert [json.loads(r.value)["url"] for r in read(reader, "videos")] == ["a"]  # nothing of bad batches


@pytest.mark.parametrize("schema", ["{", '{"type": "nonsense"}', "[1]"])
def test_invalid_schemas_are_refused_at_create(env: tuple[TopicLog, Reader], schema: str) -> None:
    log, _ = env
    with pytest.raises(errors.InvalidArgument, match="schema"):
        log.create_topic(internal_pb2.TopicConfig(name="bad", schema_json=schema))


def test_dedup_fields_form_a_permanent_unique_key(env: tuple[TopicLog, Reader]) -> None:
    log, reader = env
    log.create_topic(internal_pb2.TopicConfig(name="pages", dedup_fields=["url", "meta.lang"]))
    log.publish(publish_request(topic="pages", records=docs({"url": "x", "meta": {"lang": "en"}},
                                                                      {"url": "x", "meta": {"lang": "de"}})))
    with pytest.raises(errors.DuplicateMessage, match="record 1"):
        log.publish(publish_request(topic="pages", records=docs({"url": "y", "meta": {"lang": "en"}},
                                                                          {"url": "x", "meta": {"lang": "en"}})))
    with pytest.raises(errors.DuplicateMessage, match="record 1"):  # repeats inside one batch too
        log.publish(publish_request(topic="pages", records=docs({"url": "z", "meta": {"lang": "en"}},
                                                                          {"url": "z", "meta": {"lang": "en"}})))
    with pytest.raises(errors.InvalidArgument, match="dedup field 'meta.lang' is missing"):
        log.publish(publish_request(topic="pages", records=docs({"url": "q"})))
    assert len(read(reader, "pages")) == 2
    # an idempotent retry of a stored record is a duplicate by key, not a conflict
    rec = docs({"url": "k", "meta": {"lang": "en"}}, idempotency_key="once")
    log.publish(publish_request(topic="pages", records=rec))
    res = log.publish(publish_request(topic="pages", records=rec))
    assert res[0].duplicate


def test_cel_filters_on_headers_json_fields_key_and_op(env: tuple[TopicLog, Reader]) -> None:
    log, reader = env
    log.create_topic(internal_pb2.TopicConfig(name="orders", partitions=2))
    recs = [
        broker_pb2.PublishRecord(value=b'{"type": "order.paid", "total": 30}', headers={"source": "checkout"}),
        broker_pb2.PublishRecord(value=b'{"type": "order.paid", "total": 5}', headers={"source": "admin"}),
        broker_pb2.PublishRecord(value=b'{"type": "order.created"}', headers={"source": "checkout"}, key=b"k1"),
        broker_pb2.PublishRecord(value=b"not json", op=common_pb2.OP_DELETE, key=b"k1"),
    ]
    log.publish(publish_request(topic="orders", records=recs))
    paid = read(reader, "orders", 'value.type == "order.paid" && headers.source == "checkout"')
    assert [json.loads(r.value)["total"] for r in paid] == [30]
    assert len(read(reader, "orders", "has(value.total) && value.total > 1")) == 2
    assert [r.op for r in read(reader, "orders", 'key == b"k1" && op == "delete"')] == [common_pb2.OP_DELETE]
    assert read(reader, "orders", "partition > 5") == []
    for bad in ("value.type ==", "nonsense == 1", "x" * 5000):
        with pytest.raises(errors.InvalidArgument):
            read(reader, "orders", bad)
