"""Typed errors across the wire: per reason family, the exception class the SDK raises and the
``google.rpc.ErrorInfo`` a raw gRPC client finds in the status details (domain ``raftbroker``,
the resources named in its metadata), on the sync server (unary) and the asyncio one (streams)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from broker.client import (
    AlreadyExists,
    Client,
    DuplicateMessageError,
    FailedPrecondition,
    GroupExists,
    GroupNotFound,
    InvalidArgument,
    MemberNotFound,
    Message,
    NotFound,
    ResourceExhausted,
    RouteExists,
    RouteNotFound,
    TopicExists,
    TopicNotFound,
    Unavailable,
)
from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2, routes_pb2
from tests.cluster.stubs import Stubs, stubs
from tests.conftest import start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def client(cluster: DevCluster) -> Iterator[Client]:
    cluster.wait_ready()
    with Client(cluster.addresses, retry_deadline_s=30) as c:
        c.create_topic("why", 2, dedup_fields=["id"])
        yield c


@pytest.fixture(scope="module")
def raw(cluster: DevCluster, client: Client) -> Iterator[Stubs]:
    leader = cluster.leader()
    assert leader is not None
    s = stubs(cluster.grpc_address(leader))
    yield s
    s.close()


def error_info(call: Callable[[], object]) -> tuple[grpc.StatusCode, error_details_pb2.ErrorInfo]:
    """The code and the ErrorInfo of a call that must fail (the test fails when it carries none)."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    err = caught.value
    assert isinstance(err, grpc.Call)
    status = rpc_status.from_call(err)
    assert status is not None, f"no status details on {err.code()}: {err.details()}"
    assert status.code == err.code().value[0] and status.message == err.details()
    infos = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert len(infos) == 1, status
    assert infos[0].domain == "raftbroker"
    return err.code(), infos[0]


def test_topic_not_found(client: Client, raw: Stubs) -> None:
    with pytest.raises(TopicNotFound) as caught:
        client.describe_topic("nope")
    err = caught.value
    assert (err.code, err.reason, err.metadata) == ("NOT_FOUND", "TOPIC_NOT_FOUND", {"topic": "nope"})
    assert "'nope' does not exist" in err.message and err.refused
    code, info = error_info(lambda: raw.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name="nope")))
    assert (code, info.reason, dict(info.metadata)) == (grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND", {"topic": "nope"})
    # a response stream is served by the asyncio server: the same details
    code, info = error_info(lambda: next(iter(raw.broker.Subscribe(broker_pb2.SubscribeRequest(topic="nope")))))
    assert (code, info.reason, dict(info.metadata)) == (grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND", {"topic": "nope"})
    with pytest.raises(TopicNotFound) as caught:
        next(iter(client.subscribe("nope")))
    assert caught.value.reason == "TOPIC_NOT_FOUND"


def test_topic_exists(client: Client, raw: Stubs) -> None:
    with pytest.raises(TopicExists) as caught:
        client.create_topic("why", 2)
    assert (caught.value.code, caught.value.reason) == ("ALREADY_EXISTS", "TOPIC_EXISTS")
    assert isinstance(caught.value, AlreadyExists) and not isinstance(caught.value, GroupExists)
    code, info = error_info(lambda: raw.admin.CreateTopic(admin_pb2.CreateTopicRequest(
        config=admin_pb2.TopicConfig(name="why", partitions=2))))
    assert (code, info.reason, dict(info.metadata)) == (grpc.StatusCode.ALREADY_EXISTS, "TOPIC_EXISTS",
                                                        {"topic": "why"})


def test_group_not_found_and_exists(client: Client, raw: Stubs) -> None:
    with pytest.raises(GroupNotFound) as caught:
        client.groups.describe("why", "nobody")
    assert (caught.value.reason, caught.value.metadata) == ("GROUP_NOT_FOUND", {"topic": "why", "group": "nobody"})
    with pytest.raises(GroupNotFound):  # the data plane: a settle names the group too
        client.prune("why", group="nobody")
    code, info = error_info(lambda: raw.broker.Ack(broker_pb2.AckRequest(topic="why", group="nobody")))
    assert (code, info.reason, dict(info.metadata)) == (grpc.StatusCode.NOT_FOUND, "GROUP_NOT_FOUND",
                                                        {"topic": "why", "group": "nobody"})
    # a group on a missing topic: the topic is what is missing (no message parsing decides it)
    with pytest.raises(TopicNotFound) as missing_topic:
        client.groups.create("nope", "g")
    assert type(missing_topic.value) is TopicNotFound and missing_topic.value.reason == "TOPIC_NOT_FOUND"
    client.groups.create("why", "twice")
    with pytest.raises(GroupExists) as exists:
        client.groups.create("why", "twice")
    assert (exists.value.reason, exists.value.metadata) == ("GROUP_EXISTS", {"topic": "why", "group": "twice"})
    assert isinstance(exists.value, TopicExists)  # old handlers keep working
    code, info = error_info(lambda: raw.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="why", group="twice")))
    assert (code, info.reason) == (grpc.StatusCode.ALREADY_EXISTS, "GROUP_EXISTS")


def test_route_not_found_exists_and_cycle(client: Client, raw: Stubs) -> None:
    with pytest.raises(RouteNotFound) as caught:
        client.delete_route("no-route")
    assert (caught.value.code, caught.value.reason, caught.value.metadata) == (
        "NOT_FOUND", "ROUTE_NOT_FOUND", {"route": "no-route"})
    assert isinstance(caught.value, NotFound) and not isinstance(caught.value, TopicNotFound)
    code, info = error_info(lambda: raw.admin.DeleteRoute(routes_pb2.DeleteRouteRequest(name="no-route")))
    assert (code, info.reason, dict(info.metadata)) == (grpc.StatusCode.NOT_FOUND, "ROUTE_NOT_FOUND",
                                                        {"route": "no-route"})
    client.create_topic("why-copy", 1)
    client.create_route("why-r", "why", "why-copy")
    with pytest.raises(RouteExists) as exists:
        client.create_route("why-r", "why", "why-copy")
    assert (exists.value.reason, exists.value.metadata) == ("ROUTE_EXISTS", {"route": "why-r"})
    code, info = error_info(lambda: raw.admin.CreateRoute(routes_pb2.CreateRouteRequest(
        config=routes_pb2.RouteConfig(name="why-r", source="why", target="why-copy"))))
    assert (code, info.reason) == (grpc.StatusCode.ALREADY_EXISTS, "ROUTE_EXISTS")
    with pytest.raises(FailedPrecondition) as cycle:
        client.create_route("why-back", "why-copy", "why")
    assert cycle.value.reason == "FAILED_PRECONDITION" and cycle.value.refused


def test_duplicate_message(client: Client, raw: Stubs) -> None:
    client.publish("why", b'{"id": 1}', key=b"k")
    with pytest.raises(DuplicateMessageError) as caught:
        client.publish("why", b'{"id": 1}', key=b"k")
    assert (caught.value.code, caught.value.reason) == ("ALREADY_EXISTS", "DUPLICATE_MESSAGE")
    assert not isinstance(caught.value, TopicExists)
    request = broker_pb2.PublishRequest(topic="why", records=[broker_pb2.PublishRecord(value=b'{"id": 1}', key=b"k")])
    code, info = error_info(lambda: raw.broker.Publish(request))
    assert (code, info.reason) == (grpc.StatusCode.ALREADY_EXISTS, "DUPLICATE_MESSAGE")


def test_invalid_argument(client: Client, raw: Stubs) -> None:
    with pytest.raises(InvalidArgument) as caught:
        client.create_topic("bad name", 1)
    assert (caught.value.code, caught.value.reason) == ("INVALID_ARGUMENT", "INVALID_ARGUMENT")
    code, info = error_info(lambda: raw.admin.CreateTopic(admin_pb2.CreateTopicRequest(
        config=admin_pb2.TopicConfig(name="bad name", partitions=1))))
    assert (code, info.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")


def test_member_not_found(client: Client, raw: Stubs) -> None:
    with pytest.raises(MemberNotFound) as caught:
        client.remove_node("ghost")
    assert (caught.value.reason, caught.value.metadata) == ("MEMBER_NOT_FOUND", {"node_id": "ghost"})
    code, info = error_info(lambda: raw.admin.RemoveNode(admin_pb2.RemoveNodeRequest(id="ghost")))
    assert (code, info.reason) == (grpc.StatusCode.NOT_FOUND, "MEMBER_NOT_FOUND")


def test_not_leader_names_the_leader(cluster: DevCluster, client: Client) -> None:
    leader = cluster.leader()
    assert leader is not None
    follower = stubs(cluster.grpc_address((leader + 1) % cluster.nodes))
    try:
        request = broker_pb2.PublishRequest(topic="why", records=[broker_pb2.PublishRecord(value=b'{"id": 2}')])
        code, info = error_info(lambda: follower.broker.Publish(request))
        assert (code, info.reason) == (grpc.StatusCode.UNAVAILABLE, "NOT_LEADER")
        assert info.metadata["leader"] == cluster.grpc_address(leader)
    finally:
        follower.close()


def test_ack_says_whether_it_settled(client: Client) -> None:
    """A message acked after its lease ran out and another delivery settled it: False."""
    client.create_topic("why-ack", 1)
    client.publish("why-ack", b"one")
    consumer = client.subscribe("why-ack", group="acks", visibility_timeout_ms=500, max_attempts=10)
    try:
        first = next(m for m in consumer if isinstance(m, Message))
        deadline = time.monotonic() + 60
        again = first
        while again is first:  # the lease runs out: the same record comes again
            item = next(consumer)
            if isinstance(item, Message) and item.offset == first.offset:
                again = item
            assert time.monotonic() < deadline, "the record was not redelivered"
        assert again.ack() is True
        assert first.ack() is False
        assert again.ack() is False  # settled here already: nothing is sent
    finally:
        consumer.close()


def test_resource_exhausted_by_a_full_topic(client: Client, raw: Stubs) -> None:
    client.create_topic("why-full", 1, retention={"max_records": 1}, full_policy="reject")
    client.publish("why-full", b"one")
    with pytest.raises(ResourceExhausted) as caught:
        client.publish("why-full", b"two")
    assert caught.value.reason == "RESOURCE_EXHAUSTED" and not caught.value.refused
    request = broker_pb2.PublishRequest(topic="why-full", records=[broker_pb2.PublishRecord(value=b"three")])
    code, info = error_info(lambda: raw.broker.Publish(request))
    assert (code, info.reason) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "RESOURCE_EXHAUSTED")


@pytest.mark.timeout(240)
def test_no_quorum(tmp_path: Path) -> None:
    c = start_cluster(tmp_path)
    try:
        leader = c.leader()
        assert leader is not None
        with Client([c.grpc_address(leader)], retry_deadline_s=5) as alone:
            alone.create_topic("q", 1)
            for i in range(c.nodes):
                if i != leader:
                    c.kill(i)
            with pytest.raises(Unavailable) as caught:
                alone.publish("q", b"x")
            assert caught.value.reason in ("NO_QUORUM", "NOT_LEADER"), caught.value
            s = stubs(c.grpc_address(leader))
            try:
                request = broker_pb2.PublishRequest(topic="q", records=[broker_pb2.PublishRecord(value=b"x")])
                code, info = error_info(lambda: s.broker.Publish(request, timeout=30))
            finally:
                s.close()
            assert code == grpc.StatusCode.UNAVAILABLE
            no_quorum = info.reason == "NO_QUORUM" or info.metadata.get("no_quorum") == "true"
            assert info.reason in ("NO_QUORUM", "NOT_LEADER") and no_quorum, info
    finally:
        c.stop()
