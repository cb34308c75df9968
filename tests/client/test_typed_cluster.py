"""The SDK's typed topics, schema/dedup-field options, filters, alter/prune/clear on a real cluster."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from broker.client import (
    Client,
    DuplicateMessageError,
    Event,
    GroupNotFound,
    InvalidArgument,
    Record,
    ResourceExhausted,
    Retention,
    SchemaMismatchError,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


class Video(BaseModel):
    url: str
    title: str
    views: int = 0


class VideoV2(Video):
    language: str | None = None


class Renamed(BaseModel):
    url: str
    views: str


def test_typed_topic_round_trip(client: Client) -> None:
    videos = client.topic("videos", Video, partitions=2)
    assert videos.info.partition_count == 2 and videos.info.schema_json
    videos.publish(Video(url="https://a", title="A"), key="a")
    videos.publish({"url": "https://b", "title": "B", "views": 3})
    videos.publish_batch([Video(url=f"https://c{i}", title="C") for i in range(3)], key=lambda v: v.url)
    with pytest.raises(InvalidArgument, match="does not fit Video"):
        videos.publish({"url": "https://x"})
    with pytest.raises(InvalidArgument, match="field"):  # the server's schema refuses what the model would not
        client.publish("videos", '{"url": 5, "title": "T"}')
    with videos.subscribe(stop_at_end=True) as sub:
        got = list(sub)
    assert all(isinstance(v, Video) for v in got)
    assert sorted(v.url for v in got) == ["https://a", "https://b", "https://c0", "https://c1", "https://c2"]
    assert {v.url: v.views for v in got}["https://b"] == 3
    # a compatible model (one more optional field) opens the same topic; filters work typed too
    v2 = client.topic("videos", VideoV2)
    with v2.subscribe(stop_at_end=True, filter="value.views > 0") as sub:
        assert [v.url for v in sub] == ["https://b"]
        assert isinstance(sub.record, Record) and sub.record.topic == "videos"


def test_typed_topic_refuses_an_incompatible_schema(client: Client) -> None:
    client.topic("videos-strict", Video)
    with pytest.raises(SchemaMismatchError, match="views"):
        client.topic("videos-strict", Renamed)
    client.create_topic("untyped")
    with pytest.raises(SchemaMismatchError, match="no schema"):
        client.topic("untyped", Video)


def test_schema_dedup_fields_and_duplicate_error(client: Client) -> None:
    schema = {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}
    info = client.create_topic("pages", schema=schema, dedup_fields=["url"])
    assert info.dedup_fields == ("url",) and '"url"' in info.schema_json
    client.publish("pages", '{"url": "u1"}')
    with pytest.raises(DuplicateMessageError, match="already exists"):
        client.publish("pages", '{"url": "u1"}')
    with pytest.raises(InvalidArgument, match="record 0: field url"):
        client.publish("pages", '{"url": 1}')
    events: list[Event] = []
    filtered = [r.value for r in client.subscribe("pages", stop_at_end=True, filter='value.url == "u1"')
                if isinstance(r, Record) or events.append(r)]  # type: ignore[func-returns-value]
    assert filtered == [b'{"url": "u1"}'] and events == []
    with pytest.raises(InvalidArgument, match="invalid filter"):
        next(iter(client.subscribe("pages", filter="value.url ==")))


def test_alter_prune_and_clear(client: Client) -> None:
    client.create_topic("capped")
    client.publish_batch("capped", [b"%d" % i for i in range(10)])
    info = client.alter_topic("capped", retention={"max_records": 8}, full_policy="reject")
    assert info.retention == Retention(max_records=8) and info.full_policy == "reject"
    with pytest.raises(ResourceExhausted):
        client.publish("capped", b"x")
    kept = client.alter_topic("capped", full_policy="discard_old")
    assert kept.retention.max_records == 8 and kept.full_policy == "discard_old"
    assert client.alter_topic("capped", retention=None, full_policy=None).retention.max_records == 8
    assert client.alter_topic("capped", retention={}).retention == Retention()

    client.create_topic("prunable", 2)
    client.publish_batch("prunable", [{"value": b"%d" % i, "partition": i % 2} for i in range(20)])
    assert client.prune("prunable", 4, partition=1) == 4
    assert client.prune("prunable", 6) == 6 + 2  # partition 0 from 0, partition 1 from 4
    with pytest.raises(GroupNotFound):
        client.prune("prunable", 8, group="archiver")
    with pytest.raises(InvalidArgument, match="before_offset"):
        client.prune("prunable")
    client.clear_topic("prunable")
    described = client.describe_topic("prunable")
    assert described.records == 0 and [p.end_offset for p in described.partitions] == [10, 10]
