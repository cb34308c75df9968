"""Idempotency keys, producer-session ids and dedup windows as the SDK sends them (fake nodes).

The contract under test: every record carries a key, chosen once per call before the first
attempt, and every retry (redirect, no leader, dropped connection, deadline) resends it unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from broker.client import Client, InvalidArgument, OutgoingRecord, TopicNotFound, Unavailable
from broker.v1 import admin_pb2, broker_pb2
from tests.client.fakes import FakeNode

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
HEX32 = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture
def nodes() -> Iterator[tuple[FakeNode, FakeNode]]:
    """A leader and a follower that redirects writes to it."""
    leader, follower = FakeNode("n1"), FakeNode("n2")
    follower.script.redirect_to = leader.address
    follower.script.role, follower.script.leader_id = "follower", "n1"
    for node in (leader, follower):
        node.script.topics["t"] = 2
    yield leader, follower
    leader.stop()
    follower.stop()


def publishes(node: FakeNode) -> list[broker_pb2.PublishRequest]:
    return [r for r in node.calls("Publish") if isinstance(r, broker_pb2.PublishRequest)]


def keys_of(request: broker_pb2.PublishRequest) -> list[str]:
    return [r.idempotency_key for r in request.records]


def test_a_batch_with_a_caller_key_gets_a_generated_key_for_every_other_record(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client:
        results = client.publish_batch(
            "t", ["a", {"value": "b", "idempotency_key": "mine-1"}, OutgoingRecord("c", idempotency_key="mine-2"), "d"]
        )
        keyed = client.publish("t", "f", idempotency_key="mine-3")
    batch, single = publishes(leader)
    keys = keys_of(batch)
    assert keys[1:3] == ["mine-1", "mine-2"]
    assert HEX32.match(keys[0]) and HEX32.match(keys[3]) and keys[0] != keys[3]
    assert [r.idempotency_key for r in results] == keys, "each result names the key it was sent with"
    assert (batch.dedup_id, batch.first_msg_id) == ("", 0), "keyed batches are not sent in a session"
    assert keyed.idempotency_key == "mine-3" and keys_of(single) == ["mine-3"]
    assert not any(r.duplicate for r in [*results, keyed])


def test_batches_without_caller_keys_are_consecutive_ranges_of_one_session(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client:
        client.publish_batch("t", ["a", "b", "c"])
        client.publish("t", "d")
        client.publish_batch("t", ["e", "f"])
    first, single, third = publishes(leader)
    assert first.dedup_id.startswith("sdk-") and first.dedup_id == single.dedup_id == third.dedup_id
    assert [r.first_msg_id for r in (first, single, third)] == [1, 4, 5]
    assert all(not r.idempotency_key and not r.msg_id for req in (first, single, third) for r in req.records), (
        "session records carry no per-record id")


def test_concurrent_calls_from_many_threads_never_share_a_session_in_flight(nodes: tuple[FakeNode, FakeNode]) -> None:
    """Each call holds its session until it returns, so a session's ranges reach the broker in
    order and without gaps or overlaps whatever the number of threads."""
    leader, _ = nodes
    leader.script.publish_delays_s = [0.05] * 40  # keep calls in flight together
    with Client([leader.address]) as client, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: client.publish_batch("t", [b"%d-%d" % (i, j) for j in range(i % 3 + 1)]), range(40)))
    by_session: dict[str, list[tuple[int, int]]] = {}
    for req in publishes(leader):
        by_session.setdefault(req.dedup_id, []).append((req.first_msg_id, len(req.records)))
    assert len(by_session) > 1, "calls in flight together used several sessions"
    for dedup_id, ranges in by_session.items():
        expected = 1
        for first, count in ranges:  # in arrival order
            assert first == expected, f"session {dedup_id}: {ranges} is not one gapless sequence"
            expected += count
    assert sum(len(v) for v in leader.script.logs.values()) == sum(i % 3 + 1 for i in range(40))


def test_a_refused_batch_gives_its_numbers_back_and_an_unknown_outcome_drops_the_session(
        nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address], retry_deadline_s=0) as client:
        client.publish_batch("t", ["a", "b"])
        with pytest.raises(TopicNotFound):
            client.publish_batch("missing", ["x"])  # refused for good: its session (of "missing") is reusable
        leader.script.refuse_without_leader = 100
        with pytest.raises(Unavailable):
            client.publish_batch("t", ["c"])  # outcome unknown: that session is dropped
        leader.script.refuse_without_leader = 0
        client.publish_batch("t", ["d"])
    sent = publishes(leader)
    ok, missing, lost, after = sent[0], sent[1], sent[2], sent[-1]
    assert (ok.first_msg_id, missing.first_msg_id, lost.first_msg_id) == (1, 1, 3)
    assert lost.dedup_id == ok.dedup_id and after.dedup_id != ok.dedup_id and after.first_msg_id == 1, (
        "after an unknown outcome the next call opens a new session")


def test_a_redirect_resends_the_same_keys(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, follower = nodes
    with Client([follower.address], retry_deadline_s=5) as client:
        results = client.publish_batch("t", ["a", "b", "c"])
    (refused,) = publishes(follower)
    (accepted,) = publishes(leader)
    assert keys_of(refused) == keys_of(accepted) == [r.idempotency_key for r in results]
    assert refused == accepted


def test_no_leader_retries_resend_the_same_keys(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    leader.script.refuse_without_leader = 3
    with Client([leader.address], retry_deadline_s=10) as client:
        client.publish_batch("t", ["a", "b"])
    attempts = publishes(leader)
    assert len(attempts) == 4
    assert all(a == attempts[0] for a in attempts), "identical requests on every attempt"


def test_a_dropped_answer_is_retried_and_reported_as_the_first_copy(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address], retry_deadline_s=10) as client:
        client.publish("t", "before")
        leader.script.publish_then_drop_connection = 1  # applied, but the answer is lost
        results = client.publish_batch("t", [{"value": "x", "partition": 1}, "y"])
    first, retry = publishes(leader)[1:]
    assert first == retry
    assert [(r.partition, r.offset, r.duplicate) for r in results] == [(1, 0, True), (0, 1, True)], (
        "the retry finds the records stored by the lost attempt: same places, nothing stored twice")
    assert leader.script.logs[("t", 0)] == [b"before", b"y"] and leader.script.logs[("t", 1)] == [b"x"]


def test_a_repeated_caller_key_is_a_duplicate_with_the_first_place(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client:
        first = client.publish("t", "once", idempotency_key="order-42")
        again = client.publish("t", "once", idempotency_key="order-42")
    assert (first.duplicate, again.duplicate) == (False, True)
    assert (again.partition, again.offset) == (first.partition, first.offset)
    assert leader.script.logs[("t", 0)] == [b"once"]


def test_producer_session_ids_from_first_msg_id_or_per_record(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client:
        client.publish_batch("t", ["a", "b", "c"], dedup_id="feed", first_msg_id=7)
        client.publish_batch("t", [{"value": "d", "msg_id": 10}, OutgoingRecord("e", msg_id=-11)], dedup_id="feed")
        client.publish("t", "f", dedup_id="feed", msg_id=12)
        client.publish("t", "g")
    session, signed, single, plain = publishes(leader)
    assert session.dedup_id == "feed" and [r.msg_id for r in session.records] == [7, 8, 9]
    assert [r.msg_id for r in signed.records] == [10, -11]
    assert (single.dedup_id, [r.msg_id for r in single.records]) == ("feed", [12])
    assert plain.dedup_id.startswith("sdk-") and plain.first_msg_id == 1 and [r.msg_id for r in plain.records] == [0]
    assert not [k for req in (session, signed, single) for k in keys_of(req) if k], (
        "a caller's session is deduplicated by its watermark: no generated idempotency keys")


@pytest.mark.parametrize(
    ("records", "kwargs"),
    [
        (["a"], {"first_msg_id": 1}),  # no dedup_id
        ([{"value": "a", "msg_id": 1}], {}),  # no dedup_id
        (["a"], {"dedup_id": "s"}),  # no ids at all
        (["a"], {"dedup_id": "", "first_msg_id": 1}),
        (["a"], {"dedup_id": "s" * 257, "first_msg_id": 1}),
        (["a"], {"dedup_id": "s", "first_msg_id": 0}),
        (["a"], {"dedup_id": "s", "first_msg_id": -3}),
        ([{"value": "a", "msg_id": 1}], {"dedup_id": "s", "first_msg_id": 1}),  # both
        ([{"value": "a", "msg_id": 1}, "b"], {"dedup_id": "s"}),  # one record without an id
        ([{"value": "a", "msg_id": 1}, {"value": "b", "msg_id": 3}], {"dedup_id": "s"}),  # a gap
        ([{"value": "a", "msg_id": 2}, {"value": "b", "msg_id": -2}], {"dedup_id": "s"}),  # a repeat
        ([{"value": "a", "msg_id": 0}], {"dedup_id": "s"}),
        ([{"value": "a", "idempotency_key": ""}], {}),
        ([{"value": "a", "idempotency_key": "k" * 257}], {}),
        ([{"value": "a", "idempotency_key": 5}], {}),
        ([{"value": "a", "msg_ids": 5}], {}),  # unknown field
    ],
)
def test_bad_keys_and_ids_are_refused_before_sending(
    nodes: tuple[FakeNode, FakeNode], records: list[object], kwargs: dict[str, object]
) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client, pytest.raises(InvalidArgument):
        client.publish_batch("t", records, **kwargs)  # type: ignore[arg-type]
    assert not leader.calls("Publish")


def test_a_256_character_key_is_accepted(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client:
        assert client.publish("t", "v", idempotency_key="k" * 256).idempotency_key == "k" * 256


def test_create_topic_sends_the_dedup_window(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client:
        client.create_topic("default-window")
        client.create_topic("forever", dedup_window_ms=-1)
        client.create_topic("minute", dedup_window_ms=60_000)
        for bad in (0, -2, 1.5, True):
            with pytest.raises(InvalidArgument):
                client.create_topic("bad", dedup_window_ms=bad)  # type: ignore[arg-type]
    sent = [r.config for r in leader.calls("CreateTopic") if isinstance(r, admin_pb2.CreateTopicRequest)]
    assert [(c.name, c.dedup_window_ms) for c in sent] == [("default-window", 0), ("forever", -1), ("minute", 60_000)]


def test_reset_watermark_needs_a_dedup_id(nodes: tuple[FakeNode, FakeNode]) -> None:
    leader, _ = nodes
    with Client([leader.address]) as client, pytest.raises(InvalidArgument):
        client.reset_watermark("t", "")
