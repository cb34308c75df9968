"""Leader discovery, redirects, retries and error types of the SDK against scripted fake nodes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from broker.client import Client, InvalidArgument, TopicExists, TopicNotFound, Unavailable
from broker.client.routing import TlsWatch
from tests.client.fakes import FakeNode
from tests.conftest import wait_until

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture
def nodes() -> Iterator[tuple[FakeNode, FakeNode]]:
    """A leader and a follower that redirects writes to it."""
    leader, follower = FakeNode("n1"), FakeNode("n2")
    follower.script.redirect_to = leader.address
    follower.script.role, follower.script.leader_id = "follower", "n1"
    for node in (leader, follower):
        node.script.topics["t"] = 1
    yield leader, follower
    leader.stop()
    follower.stop()


def test_write_to_a_follower_follows_the_redirect(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, follower = nodes
    with Client([follower.address], retry_deadline_s=5) as client:
        result = client.publish("t", "v")
        assert (result.partition, result.offset) == (0, 0)
        assert client.leader == leader.address
        client.publish("t", "w")
    assert len(follower.calls("Publish")) == 1, "the leader is remembered after one redirect"
    assert len(leader.calls("Publish")) == 2


def test_reads_go_to_the_leader_found_by_node_status(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, follower = nodes
    with Client([follower.address, leader.address], retry_deadline_s=5) as client:
        client.describe_topic("t")
    assert leader.calls("DescribeTopic") and not follower.calls("DescribeTopic")


def test_no_leader_is_retried_until_one_answers(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    leader.script.refuse_without_leader = 3
    with Client([leader.address], retry_deadline_s=10) as client:
        assert client.publish("t", "v").offset == 0
    assert len(leader.calls("Publish")) == 4


def test_no_leader_past_the_deadline_raises_unavailable(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    leader.script.refuse_without_leader = 10**6
    with Client([leader.address], retry_deadline_s=0.5) as client, pytest.raises(Unavailable) as info:
        client.publish("t", "v")
    assert info.value.code == "UNAVAILABLE" and "no leader answered" in info.value.message


def test_dead_bootstrap_node_is_skipped(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, follower = nodes
    dead = FakeNode("dead")
    dead.stop()
    with Client([dead.address, follower.address], retry_deadline_s=10) as client:
        assert client.publish("t", "v").offset == 0
    assert leader.calls("Publish")


def test_nothing_listening_raises_unavailable_after_the_deadline() -> None:
    dead = FakeNode("dead")
    dead.stop()
    with Client(dead.address, retry_deadline_s=0.3) as client, pytest.raises(Unavailable):
        client.list_topics()


def test_server_errors_map_to_types(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client:
        with pytest.raises(TopicNotFound) as info:
            client.describe_topic("nope")
        assert info.value.code == "NOT_FOUND"
        with pytest.raises(TopicExists):
            client.create_topic("t")
        with pytest.raises(TopicNotFound):
            client.publish("nope", "v")


def test_client_side_bad_arguments_raise_invalid_argument_without_sending(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client:
        for call in (
            lambda: client.create_topic("x", 0),
            lambda: client.create_topic("x", durability="forever"),
            lambda: client.create_topic("x", retention={"max_age": 1}),
            lambda: client.publish("t", 42),  # type: ignore[arg-type]
            lambda: client.publish("t", "v", partition=-1),
            lambda: client.subscribe("t", start="middle"),
            lambda: client.subscribe("t", start=5, timestamp_ms=1),
        ):
            with pytest.raises(InvalidArgument):
                call()
    assert not leader.calls("CreateTopic") and not leader.calls("Publish")


def test_create_whose_first_attempt_was_lost_returns_the_topic(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    leader.script.create_then_drop_connection = True
    with Client([leader.address], retry_deadline_s=5) as client:
        info = client.create_topic("new", 3)
    assert info.name == "new" and info.partition_count == 3
    assert len(leader.calls("CreateTopic")) == 2


def test_publish_batch_accepts_dicts_values_and_records(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    leader.script.topics["t"] = 2
    from broker.client import OutgoingRecord

    with Client([leader.address]) as client:
        results = client.publish_batch(
            "t", [b"a", "b", {"value": "c", "partition": 1, "headers": {"h": "1"}}, OutgoingRecord("d", key="k")]
        )
    assert [(r.partition, r.offset) for r in results] == [(0, 0), (0, 1), (1, 0), (0, 2)]
    sent = leader.calls("Publish")[0]
    assert sent.records[2].headers["h"] == "1" and sent.records[3].key == b"k"  # type: ignore[attr-defined]


def test_a_publish_past_its_deadline_is_retried_and_stored_once(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    leader.script.publish_delays_s = [1.0]  # the first attempt is applied but answers too late
    with Client([leader.address], timeout_s=0.3, retry_deadline_s=10) as client:
        result = client.publish("t", "v")
    first, retry = leader.calls("Publish")
    assert first == retry, "the retry resends the same request, idempotency key included"
    assert (result.offset, result.duplicate) == (0, False), "the retry overtook the late first attempt"
    wait_until(lambda: leader.publishes_applied == 2, 5, "the late first attempt to be applied")
    assert leader.script.logs[("t", 0)] == [b"v"], "the late attempt is a duplicate: stored once"


def test_nodes_redirecting_to_each_other_end_in_unavailable() -> None:
    a, b = FakeNode("a"), FakeNode("b")
    a.script.redirect_to, b.script.redirect_to = b.address, a.address
    try:
        with Client([a.address], retry_deadline_s=0.5) as client, pytest.raises(Unavailable):
            client.publish("t", "v")
        assert len(a.calls("Publish")) + len(b.calls("Publish")) < 100, "redirect loops back off"
    finally:
        a.stop()
        b.stop()


def test_no_quorum_from_every_node_fails_after_the_grace_not_the_retry_deadline(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, follower = nodes
    follower.script.redirect_to = None
    for node in nodes:
        node.script.refuse_no_quorum = 10**6
    started = time.monotonic()
    with Client([leader.address, follower.address], retry_deadline_s=30, no_quorum_grace_s=0.3) as client, \
            pytest.raises(Unavailable) as info:
        client.publish("t", "v")
    assert time.monotonic() - started < 10, "well before the 30 s retry deadline"
    assert "the cluster has no quorum: (scripted)" in info.value.message  # "no quorum" once


def test_no_quorum_shorter_than_the_grace_is_retried(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    leader.script.refuse_no_quorum = 2  # a node still connecting to its peers after a restart
    with Client([leader.address], retry_deadline_s=30, no_quorum_grace_s=30) as client:
        assert client.publish("t", "v").offset == 0
    assert len(leader.calls("Publish")) == 3


def test_an_election_in_progress_restarts_the_no_quorum_watch(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, follower = nodes
    follower.script.redirect_to = None
    leader.script.refuse_no_quorum = 10**6
    follower.script.refuse_without_leader = 10**6  # this one still has a majority: an election may end
    with Client([leader.address, follower.address], retry_deadline_s=1.5, no_quorum_grace_s=0.1) as client, \
            pytest.raises(Unavailable) as info:
        client.publish("t", "v")
    assert "no leader answered within 1.5s" in info.value.message


def test_a_tls_disagreement_ends_a_call_only_once_every_known_node_said_so() -> None:
    """A certificate rotation half done (one node signed by a CA the client lacks) must not stop a
    client that the other nodes still serve: only when every known node disagrees is it final."""
    plaintext = grpc.RpcError("ipv4:h:1: Tls handshake failed (TSI_PROTOCOL_FAILURE): WRONG_VERSION_NUMBER")
    untrusted = grpc.RpcError("ipv4:h:2: Tls handshake failed: CERTIFICATE_VERIFY_FAILED: unable to get local issuer")
    watch = TlsWatch(tls=True, answers_tls={})
    watch.note("h:1", grpc.RpcError("ipv4:h:1: Socket closed"))
    watch.note("h:2", untrusted)
    assert not watch.covers(["h:1", "h:2"]), "h:1 only closed a connection"
    watch.note("h:1", plaintext)
    assert watch.covers(["h:1", "h:2"])
    said = watch.error("list topics", False).message
    assert "does not trust the nodes' certificates (h:2): no CA" in said, said
    assert "; and this client connects with TLS (its client config), and the nodes answer without it (h:1)" in said
    same = TlsWatch(tls=True, answers_tls={})
    same.note("h:1", untrusted)
    same.note("h:2", untrusted)
    assert same.error("list topics", False).message.count("(h:1, h:2)") == 1, "one kind: one sentence"
    plain = TlsWatch(tls=False, answers_tls={"h:1": True, "h:2": False})
    assert not plain.wants_probe("h:1", grpc.RpcError("Socket closed")), "probed once per router"
    assert plain.wants_probe("h:3", grpc.RpcError("ipv4:h:3: Socket closed"))
    plain.note("h:1", grpc.RpcError("Socket closed"))
    plain.note("h:2", grpc.RpcError("Socket closed"))
    assert plain.covers(["h:1"]) and not plain.covers(["h:1", "h:2"]), "h:2 does not answer TLS: it may be down"
    assert "expect TLS (h:1)" in plain.error("list topics", False).message
