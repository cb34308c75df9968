"""The asyncio SDK's topic admin, bounded reads, routes, typed topics and membership calls against a
real 3-node cluster, each test body run with the sync ``Client`` and with the ``AsyncClient``
(:mod:`tests.client.sdks`): the same calls give the same results, and the same refusals the same
error (type, code, message, reason)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import BaseModel

from broker.client import (
    Batch,
    Event,
    FailedPrecondition,
    InvalidArgument,
    MemberNotFound,
    MissingRange,
    Record,
    Retention,
    RouteExists,
    RouteNotFound,
    SchemaMismatchError,
    TopicNotFound,
)
from broker.client.aio import AsyncClient, AsyncTypedTopic
from broker.client.client import Client
from broker.devcluster import DevCluster
from tests.client.sdks import ASYNC, SYNC, Sdk, said
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

PLAIN = "parity-plain"  # a topic without a schema, made by the first refusal test
MISSING = "parity-none"  # never created


class Video(BaseModel):
    url: str
    title: str
    views: int = 0


class VideoV2(Video):
    language: str | None = None


class Renamed(BaseModel):
    url: str
    views: str


def test_alter_prune_and_clear_a_topic(sdk: Sdk) -> None:
    c, t = sdk.c, sdk.name("log-admin")
    sdk.wait(c.create_topic(t, 2, retention={"max_records": 1000}))
    info = sdk.wait(c.alter_topic(t, full_policy="reject"))
    assert (info.retention, info.full_policy) == (Retention(max_records=1000), "reject"), "retention=None keeps caps"
    info = sdk.wait(c.alter_topic(t, retention=Retention(max_age_ms=3_600_000)))
    assert (info.retention, info.full_policy) == (Retention(max_age_ms=3_600_000), "reject"), "caps are replaced"
    assert sdk.wait(c.describe_topic(t)).retention == Retention(max_age_ms=3_600_000)
    sdk.wait(c.publish_batch(t, [{"value": f"v{i}", "partition": 0} for i in range(10)]))
    assert sdk.wait(c.prune(t, 4, partition=0)) == 4
    assert sdk.wait(c.prune(t, 4, partition=0)) == 0
    assert sdk.wait(c.end_offsets(t)) == {0: (4, 10), 1: (0, 0)}
    assert sdk.wait(c.clear_topic(t)) is None
    assert sdk.wait(c.end_offsets(t)) == {0: (10, 10), 1: (0, 0)}, "cleared, and offsets keep growing"
    assert sdk.wait(c.publish(t, "after", partition=0)).offset == 10


def flat(items: list[Batch | MissingRange]) -> list[object]:
    """Batches as (offset, value) per record, holes as they are."""
    out: list[object] = []
    for item in items:
        if isinstance(item, Batch):
            out += list(zip(item.offsets, item.values, strict=True))
        else:
            out.append(item)
    return out


def test_read_ranges_end_offsets_and_timestamps(sdk: Sdk) -> None:
    c, t = sdk.c, sdk.name("ranges")
    sdk.wait(c.create_topic(t, 2))
    first = sdk.wait(c.publish_batch(t, [{"value": f"a{i}", "partition": 0} for i in range(50)]))
    assert sdk.wait(c.end_offsets(t)) == {0: (0, 50), 1: (0, 0)}
    got = sdk.list(c.read_range(t, 0, 10, 20))
    assert [(r.offset, r.value) for r in got if isinstance(r, Record)] == [(o, f"a{o}".encode()) for o in range(10, 20)]
    assert len(got) == 10
    assert sdk.list(c.read_range(t, 1, 0, 0)) == []
    later = sdk.wait(c.publish(t, "b", partition=0))
    assert sdk.wait(c.offset_for_timestamp(t, 0, first[0].timestamp_ms)) == 0
    assert sdk.wait(c.offset_for_timestamp(t, 0, later.timestamp_ms + 1)) == 51, "none that recent: the end"
    at = sdk.wait(c.offset_for_timestamp(t, 0, later.timestamp_ms))
    assert at <= 50 and all(r.timestamp_ms < later.timestamp_ms for r in first[:at])
    assert sdk.wait(c.offset_for_timestamp(t, 1, 0)) == 0, "an empty partition: its end"
    assert sdk.wait(c.prune(t, 30, partition=0)) == 30
    items = sdk.list(c.read_range(t, 0, 20, 35))
    assert items[0] == MissingRange(t, 0, 20, 30, "skip_forward")
    assert [r.offset for r in items[1:] if isinstance(r, Record)] == list(range(30, 35)) and len(items) == 6
    assert flat(sdk.list(c.read_range_batches(t, 0, 20, 35))) == [
        items[0], *((r.offset, r.value) for r in items[1:] if isinstance(r, Record))]
    tail = sdk.list(c.read_range(t, 0, 48, 60))
    assert [r.offset for r in tail if isinstance(r, Record)] == [48, 49, 50]
    assert tail[-1] == MissingRange(t, 0, 51, 60, "gap"), "past the log end: reported missing, not waited for"


def test_routes_are_created_listed_and_deleted(sdk: Sdk) -> None:
    c, source, target, name = sdk.c, sdk.name("route-src"), sdk.name("route-dst"), sdk.name("route")
    sdk.wait(c.create_topic(source, 1))
    sdk.wait(c.create_topic(target, 1))
    sdk.wait(c.publish_batch(source, [{"value": f"v{i}", "key": "keep" if i % 2 else "drop"} for i in range(6)]))
    keep = 'string(key) == "keep"'
    info = sdk.wait(c.create_route(name, source, target, filter=keep, ops=["insert"]))
    assert (info.name, info.source, info.target, info.filter, info.ops) == (name, source, target, keep, ("insert",))
    assert name in [r.name for r in sdk.wait(c.list_routes())]
    with pytest.raises(RouteExists):
        sdk.wait(c.create_route(name, source, target))
    wait_until(lambda: sdk.wait(c.route(name)).lag == 0, 30, "the route to catch up")
    wait_until(lambda: sdk.wait(c.end_offsets(target))[0][1] == 3, 30, "the copies")
    copied = sdk.list(c.read_range(target, 0, 0, 3))
    assert [r.value for r in copied if isinstance(r, Record)] == [b"v1", b"v3", b"v5"]
    assert sdk.wait(c.route(name)).partitions[0].next_offset == 6
    assert sdk.wait(c.delete_route(name)) is None
    assert name not in [r.name for r in sdk.wait(c.list_routes())]
    with pytest.raises(RouteNotFound, match=f"route '{name}' does not exist"):
        sdk.wait(c.route(name))
    with pytest.raises(RouteNotFound):
        sdk.wait(c.delete_route(name))


def test_typed_topics_publish_and_read_model_instances(sdk: Sdk) -> None:
    c, name = sdk.c, sdk.name("videos")
    videos = sdk.wait(c.topic(name, Video, partitions=2))
    assert isinstance(videos, AsyncTypedTopic) == (sdk.kind == ASYNC)
    assert videos.name == name and videos.info.partition_count == 2 and videos.info.schema_json
    assert sdk.wait(videos.publish(Video(url="https://a", title="A"), key="a", partition=0)).offset == 0
    sdk.wait(videos.publish({"url": "https://b", "title": "B", "views": 3}, partition=1))
    batch = sdk.wait(videos.publish_batch([Video(url=f"https://c{i}", title="C") for i in range(3)],
                                          key=lambda v: v.url))
    assert len(batch) == 3
    with pytest.raises(InvalidArgument, match="the value does not fit Video"):
        sdk.wait(videos.publish({"url": "https://x"}))
    got = sdk.list(videos.subscribe(stop_at_end=True))
    assert all(isinstance(v, Video) for v in got)
    assert sorted(v.url for v in got) == ["https://a", "https://b", "https://c0", "https://c1", "https://c2"]
    keys = {r.value: r.key for r in sdk.list(c.subscribe(name, stop_at_end=True)) if isinstance(r, Record)}
    assert sorted(k for k in keys.values() if k and k.startswith(b"https")) == [b"https://c0", b"https://c1",
                                                                                  b"https://c2"]
    later = sdk.wait(c.topic(name, VideoV2))  # one more optional field: compatible
    sub = later.subscribe(stop_at_end=True, filter="value.views > 0")
    assert [v.url for v in sdk.list(sub)] == ["https://b"]
    assert sub.record is not None and (sub.record.topic, sub.record.partition) == (name, 1)
    err = sdk.error(lambda: c.topic(name, Renamed))
    assert isinstance(err, SchemaMismatchError) and f"topic {name!r} cannot carry Renamed: field 'views'" in err.message
    sdk.wait(c.prune(name, 1, partition=0))
    events: list[Event] = []
    rest = sdk.list(videos.subscribe(partition=0, start=0, stop_at_end=True, on_event=events.append))
    assert [e.type for e in events] == ["skip_forward"], "events go to on_event, not to the reader"
    assert "https://a" not in [v.url for v in rest]


Call = Callable[[Client | AsyncClient], object]
REFUSALS: list[tuple[str, Call, type[Exception]]] = [
    ("alter-missing-topic", lambda c: c.alter_topic(MISSING, full_policy="reject"), TopicNotFound),
    ("alter-missing-topic-caps", lambda c: c.alter_topic(MISSING, retention={"max_records": 5}), TopicNotFound),
    ("alter-unknown-full-policy", lambda c: c.alter_topic(PLAIN, full_policy="bogus"), InvalidArgument),
    ("alter-cap-below-1", lambda c: c.alter_topic(PLAIN, retention={"max_bytes": 0}), InvalidArgument),
    ("clear-missing-topic", lambda c: c.clear_topic(MISSING), TopicNotFound),
    ("prune-group-before-0", lambda c: c.prune(PLAIN, 0, group="archiver"), InvalidArgument),
    ("end-offsets-missing-topic", lambda c: c.end_offsets(MISSING), TopicNotFound),
    ("timestamp-missing-partition", lambda c: c.offset_for_timestamp(PLAIN, 7, 0), InvalidArgument),
    ("timestamp-negative", lambda c: c.offset_for_timestamp(PLAIN, 0, -1), InvalidArgument),
    ("timestamp-missing-topic", lambda c: c.offset_for_timestamp(MISSING, 0, 0), TopicNotFound),
    ("range-backwards", lambda c: c.read_range(PLAIN, 0, 5, 2), InvalidArgument),
    ("range-batches-backwards", lambda c: c.read_range_batches(PLAIN, 0, 5, 2), InvalidArgument),
    ("range-missing-topic", lambda c: c.read_range(MISSING, 0, 0, 2), TopicNotFound),
    ("route-missing", lambda c: c.route(MISSING), RouteNotFound),
    ("delete-route-missing", lambda c: c.delete_route(MISSING), RouteNotFound),
    ("route-ops-one-str", lambda c: c.create_route("parity-r", PLAIN, MISSING, ops="insert"), InvalidArgument),
    ("route-into-itself", lambda c: c.create_route("parity-loop", PLAIN, PLAIN), FailedPrecondition),
    ("typed-topic-without-schema", lambda c: c.topic(PLAIN, Video), SchemaMismatchError),
    ("typed-topic-of-no-model", lambda c: c.topic(PLAIN, dict), InvalidArgument),  # type: ignore[type-var]
    ("remove-a-non-member", lambda c: c.remove_node("n9"), MemberNotFound),
]


@pytest.fixture(scope="module")
def plain_topic(sdks: dict[str, Sdk]) -> str:
    sync = sdks[SYNC]
    sync.wait(sync.c.create_topic(PLAIN, 1))
    sync.wait(sync.c.publish(PLAIN, "x"))
    return PLAIN


@pytest.mark.parametrize(("call", "error"), [case[1:] for case in REFUSALS], ids=[case[0] for case in REFUSALS])
def test_both_sdks_refuse_alike(sdks: dict[str, Sdk], plain_topic: str, call: Call, error: type[Exception]) -> None:
    sync, aio = sdks[SYNC], sdks[ASYNC]
    said_sync = said(sync.error(lambda: call(sync.c)))
    said_async = said(aio.error(lambda: call(aio.c)))
    assert said_sync[0] == error.__name__, said_sync
    assert said_async == said_sync


def test_add_and_remove_a_node(cluster: DevCluster, sdks: dict[str, Sdk]) -> None:
    """Last in this module: the cluster grows to 4 members and is back to its 3 afterwards."""
    aio = sdks[ASYNC]
    assert isinstance(aio.c, AsyncClient)
    i = cluster.nodes  # not started: refused alike by both SDKs (the leader waits 5 s for it to answer)
    args = (cluster.node_id(i), cluster.raft_address(i), cluster.grpc_address(i))
    refused = []
    for sdk in sdks.values():
        client = sdk.c
        refused.append(said(sdk.error(lambda: client.add_node(*args))))  # noqa: B023 (called at once)
    assert refused[0][0] == "FailedPrecondition" and "start it first" in refused[0][2] and refused[1] == refused[0]
    assert cluster.add_node() == i

    def members() -> set[str]:
        return {n.id for n in aio.wait(aio.c.cluster_status()).nodes}

    aio.wait(aio.c.add_node(*args))
    aio.wait(aio.c.add_node(*args))  # idempotent
    assert cluster.grpc_address(i) in aio.c.known_addresses
    wait_until(lambda: cluster.node_id(i) in members(), 30, "every node to know the new member")
    wait_until(lambda: (s := cluster.node_status(i)) is not None and s.leader_id, 60, "the new node to follow")
    aio.wait(aio.c.remove_node(cluster.node_id(i)))
    wait_until(lambda: members() == {cluster.node_id(j) for j in range(3)}, 30, "the node to be removed")
    cluster.kill(i)
    assert aio.wait(aio.c.publish(PLAIN, "after")).offset >= 1, "the 3 members go on"
