"""The packed publish form and the compact answer (issue 15 item 3) through the real gRPC API of a
3-node cluster: every answer is checked against what the nodes store, every refusal changes nothing,
and a client of the old form (repeated records, no results option) keeps its answers."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from broker.client import Client, OutgoingRecord
from broker.client.aio import AsyncClient
from broker.devcluster import DevCluster
from broker.leader.partitioning import partition_for_key
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.stubs import Stubs, refused, stubs

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
PARTITIONS = 3
COMPACT = broker_pb2.RESULT_FORM_COMPACT


@pytest.fixture(scope="module")
def s(cluster: DevCluster) -> Stubs:
    cluster.wait_ready(60)
    leader = cluster.leader()
    assert leader is not None
    return stubs(cluster.grpc_address(leader))


def make_topic(s: Stubs, name: str) -> None:
    s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name=name, partitions=PARTITIONS)))


def stored(s: Stubs, topic: str) -> dict[tuple[int, int], common_pb2.Record]:
    """Every record of ``topic`` by (partition, offset), read back from the leader."""
    out: dict[tuple[int, int], common_pb2.Record] = {}
    for p in range(PARTITIONS):
        req = broker_pb2.SubscribeRequest(topic=topic, partition=p, stop_at_end=True, max_batch=5000)
        for item in s.broker.Subscribe(req, timeout=120):
            out.update(((r.partition, r.offset), r) for r in item.batch.records)
    return out


def packed(*records: broker_pb2.PublishRecord) -> list[bytes]:
    return [r.SerializeToString() for r in records]


def places(s: Stubs, request: broker_pb2.PublishRequest) -> list[tuple[int, int, int, bool]]:
    """The answer as (partition, offset, timestamp_ms, duplicate) per record, from either form
    (the compact one unfolded here by hand, independently of the SDK's code)."""
    response = s.broker.Publish(request, timeout=60)
    if response.results:
        return [(r.partition, r.offset, r.timestamp_ms, r.duplicate) for r in response.results]
    following = {r.partition: r.base_offset for r in response.ranges}
    stamps = {r.partition: r.timestamp_ms for r in response.ranges}
    assert sum(r.count for r in response.ranges) == len(response.partitions)
    out = []
    for p in response.partitions:
        out.append((p, following[p], stamps[p], False))
        following[p] += 1
    return out


def mixed() -> list[broker_pb2.PublishRecord]:
    """Round-robin, keyed and explicit records interleaved, some with headers and ops."""
    return [broker_pb2.PublishRecord(value=b"rr-0"), broker_pb2.PublishRecord(value=b"key-a", key=b"a"),
            broker_pb2.PublishRecord(value=b"p2", partition=2), broker_pb2.PublishRecord(value=b"rr-1"),
            broker_pb2.PublishRecord(value=b"hdr", headers={"h": "1"}, op=common_pb2.OP_UPDATE),
            broker_pb2.PublishRecord(value=b"key-b", key=b"b"), broker_pb2.PublishRecord(value=b"rr-2"),
            broker_pb2.PublishRecord(value=b"", op=common_pb2.OP_TOMBSTONE, key=b"a")]


def test_packed_compact_places_match_the_stored_records_for_every_placement(s: Stubs) -> None:
    make_topic(s, "pk-mixed")
    for records, form in ((mixed(), COMPACT), (mixed(), broker_pb2.RESULT_FORM_PER_RECORD),
                          ([broker_pb2.PublishRecord(value=b"plain-%d" % i) for i in range(50)], COMPACT),
                          ([broker_pb2.PublishRecord(value=b"k-%d" % i, key=b"%d" % i) for i in range(50)], COMPACT)):
        request = broker_pb2.PublishRequest(topic="pk-mixed", packed_records=packed(*records), results=form)
        response = s.broker.Publish(request, timeout=60)
        assert bool(response.results) == (form != COMPACT), "compact unless asked per record (no duplicates here)"
        got = places(s, broker_pb2.PublishRequest(topic="pk-mixed", packed_records=packed(*records), results=form))
        found = stored(s, "pk-mixed")
        for rec, (partition, offset, ts, duplicate) in zip(records, got, strict=True):
            assert not duplicate
            if rec.HasField("partition"):
                assert partition == rec.partition
            elif rec.HasField("key"):
                assert partition == partition_for_key(rec.key, PARTITIONS)
            back = found[(partition, offset)]
            assert (back.value, back.op, dict(back.headers), back.timestamp_ms) == (
                rec.value, rec.op, dict(rec.headers), ts), "the answer names the place that holds this record"
            assert back.HasField("key") == rec.HasField("key") and back.key == rec.key
        rr = [p for rec, (p, *_) in zip(records, got, strict=True) if not rec.HasField("key")
              and not rec.HasField("partition")]
        assert len(set(rr)) == min(len(rr), PARTITIONS), "round-robin records spread over the partitions"


def test_the_old_form_keeps_its_per_record_answer(s: Stubs) -> None:
    make_topic(s, "pk-old")
    request = broker_pb2.PublishRequest(topic="pk-old", records=mixed())  # today's client: no results option
    response = s.broker.Publish(request, timeout=60)
    assert len(response.results) == len(mixed()) and not response.ranges and not response.partitions
    found = stored(s, "pk-old")
    for rec, r in zip(mixed(), response.results, strict=True):
        assert found[(r.partition, r.offset)].value == rec.value


def test_a_retried_session_batch_answers_the_first_places_record_by_record(s: Stubs) -> None:
    make_topic(s, "pk-retry")
    records = [broker_pb2.PublishRecord(value=b"v%d" % i, **({"key": b"k%d" % i} if i % 3 else {}))  # type: ignore[arg-type]
               for i in range(30)]
    request = broker_pb2.PublishRequest(topic="pk-retry", packed_records=packed(*records), dedup_id="pk-feed",
                                        first_msg_id=1, results=COMPACT)
    first = places(s, request)
    again = s.broker.Publish(request, timeout=60)
    assert len(again.results) == len(records) and not again.ranges, "a duplicate falls back to per-record results"
    assert [(r.partition, r.offset, r.timestamp_ms) for r in again.results] == [p[:3] for p in first]
    assert all(r.duplicate for r in again.results)
    assert len(stored(s, "pk-retry")) == len(records), "stored once"


def test_bad_packed_requests_are_refused_precisely_and_store_nothing(s: Stubs) -> None:
    make_topic(s, "pk-bad")
    good = packed(broker_pb2.PublishRecord(value=b"ok"))[0]
    cases: list[tuple[broker_pb2.PublishRequest, str]] = [
        (broker_pb2.PublishRequest(topic="pk-bad", packed_records=[good],
                                   records=[broker_pb2.PublishRecord(value=b"x")]),
         "give either records or packed_records, not both"),
        (broker_pb2.PublishRequest(topic="pk-bad", packed_records=[good, good, b"\x2a\x05ab"]),
         "packed record 2 (4 bytes) is not a PublishRecord"),
        (broker_pb2.PublishRequest(topic="pk-bad", packed_records=[good, good + b"\x48\x07"]),
         "record 1: unknown op 7"),
        (broker_pb2.PublishRequest(topic="pk-bad", packed_records=packed(broker_pb2.PublishRecord(value=b"x",
                                                                                                   partition=9))),
         "record 0: partition 9 does not exist"),
        (broker_pb2.PublishRequest(topic="pk-bad", packed_records=[good, b"\x2a\x80\x80\x40" + b"x" * (1 << 20)]),
         "record 1 is"),
        (broker_pb2.PublishRequest(topic="pk-bad", dedup_id="d", packed_records=[good]),
         "record 0: a msg_id (non-zero) is required with dedup_id"),
    ]
    for request, message in cases:
        code, details = refused(lambda request=request: s.broker.Publish(request, timeout=60))  # type: ignore[misc]
        assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, (message, details)
    assert stored(s, "pk-bad") == {}, "nothing was stored"


def test_a_packed_record_cannot_forge_its_producer_origin_or_msg_id(s: Stubs) -> None:
    """RecordBody's producer (8), origin (10) and msg_id (11) are not PublishRecord fields: in a
    packed record they are dropped, with or without a key, like unknown fields of the old form."""
    make_topic(s, "pk-forge")
    forged = b"\x42\x07mallory" + b"\x52\x04evil" + b"\x5a\x0299"  # producer, origin, msg_id
    bodies = [packed(broker_pb2.PublishRecord(value=b"plain"))[0] + forged,
              packed(broker_pb2.PublishRecord(value=b"keyed", key=b"k"))[0] + forged,
              forged + packed(broker_pb2.PublishRecord(value=b"first"))[0]]
    got = places(s, broker_pb2.PublishRequest(topic="pk-forge", packed_records=bodies, results=COMPACT))
    found = stored(s, "pk-forge")
    for (partition, offset, *_), value in zip(got, (b"plain", b"keyed", b"first"), strict=True):
        back = found[(partition, offset)]
        assert back.value == value and back.producer == "" and back.msg_id == ""
        assert back.origin != "evil" and back.origin, "the leader's origin stamp, not the client's"


def test_the_sdks_send_the_packed_form_and_read_compact_answers(cluster: DevCluster, s: Stubs) -> None:
    make_topic(s, "pk-sdk")
    batch: list[object] = [b"a", "b", {"value": "c", "partition": 1, "headers": {"h": "1"}},
                           OutgoingRecord("d", key="k"), OutgoingRecord("e", op="delete")]
    batch += [b"x%d" % i for i in range(40)]
    with Client(cluster.addresses) as client:
        results = client.publish_batch("pk-sdk", batch)  # type: ignore[arg-type]
        plain = client.publish_batch("pk-sdk", [b"p%d" % i for i in range(40)])

    async def aio() -> list[object]:
        async with AsyncClient(cluster.addresses) as c:
            more: list[bytes | OutgoingRecord] = [b"q%d" % i for i in range(40)]
            return list(await c.publish_batch("pk-sdk", [*more, OutgoingRecord("kk", key="k")]))

    aio_results = asyncio.run(aio())
    found = stored(s, "pk-sdk")
    values = [b"a", b"b", b"c", b"d", b"e"] + [b"x%d" % i for i in range(40)]
    values += [b"p%d" % i for i in range(40)] + [b"q%d" % i for i in range(40)] + [b"kk"]
    everything = [*results, *plain, *aio_results]
    assert len(found) == len(values) == len(everything)
    for r, value in zip(everything, values, strict=True):
        back = found[(r.partition, r.offset)]
        assert back.value == value and back.timestamp_ms == r.timestamp_ms and not r.duplicate
    assert results[2].partition == 1 and results[3].partition == partition_for_key(b"k", PARTITIONS)
    assert found[(results[4].partition, results[4].offset)].op == common_pb2.OP_DELETE
