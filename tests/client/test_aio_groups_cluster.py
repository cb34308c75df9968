"""The asyncio SDK's groups admin (``client.groups``) and a consumer's ``commit``/``unsettled``
against a real 3-node cluster, each test body run with the sync ``Client`` and with the
``AsyncClient`` (:mod:`tests.client.sdks`): the same calls give the same results, and the same
refusals the same error (type, code, message, reason)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from broker.client import (
    Client,
    DeadLettersRetried,
    Event,
    FailedPrecondition,
    GroupExists,
    GroupNotFound,
    InvalidArgument,
    Message,
    TopicNotFound,
)
from broker.client.aio import AsyncClient, AsyncConsumer, AsyncMessage
from broker.core import formats
from tests.client.sdks import ASYNC, SYNC, Sdk, said
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

REFUSED = "groups-parity"  # the topic of the refusal cases, with the queue group QUEUE
QUEUE = "queue"


def test_groups_are_created_described_moved_paused_and_deleted(sdk: Sdk) -> None:
    c, t, g = sdk.c, sdk.name("groups"), "workers"
    sdk.wait(c.create_topic(t, 2))
    info = sdk.wait(c.groups.create(t, g, "queue", visibility_timeout_ms=5000, max_attempts=3, backoff="fixed"))
    assert (info.topic, info.group, info.mode, info.visibility_timeout_ms, info.max_attempts, info.backoff,
            info.paused, info.prune_role) == (t, g, "queue", 5000, 3, "fixed", False, "none")
    assert sdk.wait(c.groups.describe(t, g)) == info
    assert sdk.wait(c.groups.create(t, "tailers", mode="stream")).mode == "stream"
    assert sorted(i.group for i in sdk.wait(c.groups.list(t))) == ["tailers", g]
    with pytest.raises(GroupExists):
        sdk.wait(c.groups.create(t, g, "queue"))
    assert sdk.wait(c.groups.pause(t, g)) == [g]
    assert sdk.wait(c.groups.describe(t, g)).paused and sdk.wait(c.groups.lag(t, g)).paused
    assert sdk.wait(c.groups.resume(t)) == [g], "every group of the topic; only the paused one changed"
    assert not sdk.wait(c.groups.lag(t, g)).paused
    first = sdk.wait(c.publish_batch(t, [{"value": f"v{i}", "partition": 0} for i in range(10)]))
    lag = sdk.wait(c.groups.lag(t, g))
    assert lag.lag == 10
    if isinstance(c, AsyncClient):  # the HTTP gateway's name for it
        assert [(p.partition, p.committed, p.lag) for p in sdk.wait(c.group_lag(t, g)).partitions] == [(0, 0, 10),
                                                                                                     (1, 0, 0)]
    assert [(p.partition, p.committed, p.end_offset) for p in lag.partitions] == [(0, 0, 10), (1, 0, 0)]
    assert sdk.wait(c.groups.seek(t, g, "latest")) == {0: 10, 1: 0}
    assert sdk.wait(c.groups.lag(t, g)).lag == 0
    assert sdk.wait(c.groups.seek(t, g, 4, partition=0)) == {0: 4}
    assert sdk.wait(c.groups.lag(t, g)).lag == 6
    assert sdk.wait(c.groups.replay(t, g, first[0].timestamp_ms)) == {0: 0, 1: 0}
    assert sdk.wait(c.groups.lag(t, g)).lag == 10
    assert sdk.wait(c.groups.mark(t, g, "lead")).prune_role == "lead"
    sdk.wait(c.groups.seek(t, g, 3, partition=0))
    assert sdk.wait(c.prune(t, group=g)) == 3, "a lead group prunes up to what it committed"
    assert sdk.wait(c.groups.delete(t, g)) is None
    with pytest.raises(GroupNotFound):
        sdk.wait(c.groups.describe(t, g))
    with pytest.raises(GroupNotFound):
        sdk.wait(c.groups.delete(t, g))
    assert [i.group for i in sdk.wait(c.groups.list(t))] == ["tailers"]


def discard_all(sdk: Sdk, topic: str, group: str, n: int) -> list[int]:
    """Lease ``n`` messages as a member of ``group`` and discard each; their offsets."""
    consumer = sdk.c.subscribe(topic, group=group, stop_at_end=True)
    try:
        messages = sdk.take(consumer, n)
        for m in messages:
            assert isinstance(m, Message | AsyncMessage), m
            sdk.wait(m.discard("bad"))
        return [m.offset for m in messages if isinstance(m, Message | AsyncMessage)]
    finally:
        sdk.wait(consumer.close())


def test_dead_letters_are_listed_retried_and_purged(sdk: Sdk) -> None:
    c, t, g = sdk.c, sdk.name("dead"), "dlq"
    sdk.wait(c.create_topic(t, 1))
    sdk.wait(c.publish_batch(t, [f"v{i}" for i in range(6)]))
    sdk.wait(c.groups.create(t, g, "queue"))
    assert discard_all(sdk, t, g, 6) == list(range(6))
    dead = sdk.wait(c.groups.dead_letters(t, g))
    assert [(d.partition, d.offset, d.reason) for d in dead] == [(0, o, "discarded: bad") for o in range(6)]
    assert [d.record.value if d.record else None for d in dead] == [f"v{i}".encode() for i in range(6)]
    page = sdk.wait(c.groups.dead_letters(t, g, limit=2, partition=0, after_offset=1))
    assert [d.offset for d in page] == [2, 3]
    assert sdk.wait(c.groups.lag(t, g)).partitions[0].dead == 6
    assert sdk.wait(c.groups.retry_dead_letters(t, g, [(0, 1), (0, 99)])) == DeadLettersRetried(1, 0)
    assert [d.offset for d in sdk.wait(c.groups.dead_letters(t, g))] == [0, 2, 3, 4, 5]
    assert discard_all(sdk, t, g, 1) == [1], "the retried one is delivered again"

    def pruned_stay_dead() -> bool:  # from command format 3, raised by the leader's housekeeping after a start
        leader = sdk.wait(c.cluster_status()).leader
        return leader is not None and leader.cluster_format >= formats.PRUNED_DEAD_FORMAT

    wait_until(pruned_stay_dead, 60, "the cluster's command format to reach PRUNED_DEAD_FORMAT")
    assert sdk.wait(c.prune(t, 2)) == 2
    assert sdk.wait(c.groups.retry_all_dead_letters(t, g)) == DeadLettersRetried(4, 2), "pruned ones stay dead"
    assert [d.offset for d in sdk.wait(c.groups.dead_letters(t, g))] == [0, 1]
    assert sdk.wait(c.groups.purge_dead_letters(t, g)) == 2
    assert sdk.wait(c.groups.dead_letters(t, g)) == []


def test_a_stream_member_commits_and_knows_what_it_has_not_settled(sdk: Sdk) -> None:
    c, t, g = sdk.c, sdk.name("commits"), "tail"
    sdk.wait(c.create_topic(t, 1))
    sdk.wait(c.publish_batch(t, [f"v{i}" for i in range(6)]))
    consumer = c.subscribe(t, group=g, mode="stream")
    try:
        messages = sdk.take(consumer, 4)
        assert [m.offset for m in messages if not isinstance(m, Event)] == [0, 1, 2, 3]
        assert [m.offset for m in consumer.unsettled()] == [0, 1, 2, 3]
        first = messages[0]
        assert isinstance(first, Message | AsyncMessage)
        assert sdk.wait(first.ack()) is True
        assert [m.offset for m in consumer.unsettled()] == [1, 2, 3], "a settled message is forgotten"
        assert sdk.wait(consumer.commit(0, 3)) is None
        assert sdk.wait(c.groups.lag(t, g)).partitions[0].committed == 3
        assert [m.offset for m in consumer.unsettled()] == [3], "a commit settles what lies below it"
        assert all(m.settled for m in messages[:3] if not isinstance(m, Event))
        sdk.wait(consumer.commit(0, 1))
        assert sdk.wait(c.groups.lag(t, g)).partitions[0].committed == 3, "a commit never moves back"
    finally:
        sdk.wait(consumer.close())
    assert consumer.unsettled() == [], "close gives every lease back"


def commit_as_member(c: Client | AsyncClient, partition: int,
                     offset: int) -> None | Coroutine[Any, Any, None]:
    """Commit as a (new) member of the queue group QUEUE, then leave."""
    consumer = c.subscribe(REFUSED, group=QUEUE)
    if isinstance(consumer, AsyncConsumer):
        async def commit() -> None:
            try:
                await consumer.commit(partition, offset)
            finally:
                await consumer.close()
        return commit()
    with consumer:
        consumer.commit(partition, offset)
    return None


Call = Callable[[Client | AsyncClient], object]
REFUSALS: list[tuple[str, Call, type[Exception]]] = [
    ("describe-missing", lambda c: c.groups.describe(REFUSED, "none"), GroupNotFound),
    ("delete-missing", lambda c: c.groups.delete(REFUSED, "none"), GroupNotFound),
    ("seek-missing", lambda c: c.groups.seek(REFUSED, "none", "latest"), GroupNotFound),
    ("lag-missing", lambda c: c.groups.lag(REFUSED, "none"), GroupNotFound),
    ("purge-missing", lambda c: c.groups.purge_dead_letters(REFUSED, "none"), GroupNotFound),
    ("list-missing-topic", lambda c: c.groups.list("groups-none"), TopicNotFound),
    ("create-existing", lambda c: c.groups.create(REFUSED, QUEUE, "queue"), GroupExists),
    ("create-unknown-mode", lambda c: c.groups.create(REFUSED, "g", "fifo"), InvalidArgument),
    ("create-unknown-option", lambda c: c.groups.create(REFUSED, "g", bogus=1), InvalidArgument),
    ("create-queue-with-session", lambda c: c.groups.create(REFUSED, "g", "queue", session_timeout_ms=1000),
     InvalidArgument),
    ("mark-unknown-role", lambda c: c.groups.mark(REFUSED, QUEUE, "boss"), InvalidArgument),
    ("dead-letters-negative-limit", lambda c: c.groups.dead_letters(REFUSED, QUEUE, limit=-1), InvalidArgument),
    ("retry-negative-partition", lambda c: c.groups.retry_dead_letters(REFUSED, QUEUE, [(-1, 0)]), InvalidArgument),
    ("retry-missing-partition", lambda c: c.groups.retry_dead_letters(REFUSED, QUEUE, [(9, 0)]), InvalidArgument),
    ("seek-negative-partition", lambda c: c.groups.seek(REFUSED, QUEUE, 0, partition=-1), InvalidArgument),
    ("commit-in-queue-mode", lambda c: commit_as_member(c, 0, 1), FailedPrecondition),
    ("commit-negative-partition", lambda c: commit_as_member(c, -1, 1), InvalidArgument),
]


@pytest.fixture(scope="module")
def refused_topic(sdks: dict[str, Sdk]) -> str:
    sync = sdks[SYNC]
    sync.wait(sync.c.create_topic(REFUSED, 1))
    sync.wait(sync.c.groups.create(REFUSED, QUEUE, "queue"))
    return REFUSED


@pytest.mark.parametrize(("call", "error"), [case[1:] for case in REFUSALS], ids=[case[0] for case in REFUSALS])
def test_both_sdks_refuse_alike(sdks: dict[str, Sdk], refused_topic: str, call: Call, error: type[Exception]) -> None:
    sync, aio = sdks[SYNC], sdks[ASYNC]
    sync_error, async_error = sync.error(lambda: call(sync.c)), aio.error(lambda: call(aio.c))
    assert isinstance(sync_error, error), said(sync_error)
    assert said(async_error) == said(sync_error)
