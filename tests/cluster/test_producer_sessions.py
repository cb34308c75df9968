"""Producer sessions by range through the real gRPC API of a 3-node cluster (SPEC §4).

A ``PublishRequest`` with ``dedup_id`` and ``first_msg_id`` is that session's messages
``first .. first + n - 1``; a retry answers the original places; bad numbers are refused with
INVALID_ARGUMENT and change nothing; the SDK publishes this way by default, from several threads,
and recovers by itself when its session no longer fits (a reset watermark, a re-created topic).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from broker.client import Client, wire
from broker.client.aio import AsyncClient
from broker.client.errors import error_from_rpc
from broker.devcluster import DevCluster
from broker.reasons import Reason
from broker.v1 import admin_pb2, broker_pb2
from tests.cluster.digests import partition_contents, wait_converged
from tests.cluster.stubs import Stubs, stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def request(topic: str, first: int, values: list[bytes], dedup_id: str = "feed", **record: object
            ) -> broker_pb2.PublishRequest:
    return broker_pb2.PublishRequest(topic=topic, dedup_id=dedup_id, first_msg_id=first, records=[
        broker_pb2.PublishRecord(value=v, **record) for v in values])  # type: ignore[arg-type]


def places(response: broker_pb2.PublishResponse) -> list[tuple[int, int, int, bool]]:
    return [(r.partition, r.offset, r.timestamp_ms, r.duplicate) for r in response.results]


def leader_stubs(c: DevCluster) -> Stubs:
    c.wait_ready(60)
    leader = c.leader()
    assert leader is not None
    return stubs(c.grpc_address(leader))


def ends(s: Stubs, topic: str) -> list[int]:
    info = s.admin.DescribeTopic(admin_pb2.DescribeTopicRequest(name=topic))
    return [p.end_offset for p in info.partitions]


def marks(s: Stubs, topic: str) -> dict[str, int]:
    found = s.admin.GetWatermarks(admin_pb2.GetWatermarksRequest(topic=topic)).watermarks
    return {m.dedup_id: m.msg_id for m in found}


def test_a_retried_session_batch_answers_its_original_places_and_overlaps_store_only_the_tail(
        cluster: DevCluster) -> None:
    with Client(cluster.addresses) as client:
        client.create_topic("sessions-retry", 3)
    s = leader_stubs(cluster)
    try:
        first = s.broker.Publish(request("sessions-retry", 1, [b"a", b"b", b"c", b"d"]))
        assert not any(d for *_, d in places(first))
        retry = s.broker.Publish(request("sessions-retry", 1, [b"a", b"b", b"c", b"d"]))
        assert places(retry) == [(p, o, ts, True) for p, o, ts, _ in places(first)]
        overlap = s.broker.Publish(request("sessions-retry", 3, [b"c", b"d", b"e"]))
        assert [d for *_, d in places(overlap)] == [True, True, False]
        assert places(overlap)[:2] == [(p, o, ts, True) for p, o, ts, _ in places(first)[2:]]
        assert sum(ends(s, "sessions-retry")) == 5 and marks(s, "sessions-retry") == {"feed": 5}
    finally:
        s.close()


@pytest.mark.parametrize(("bad", "message"), [
    (request("sessions-bad", 1, [b"x"], dedup_id=""), "first_msg_id needs a dedup_id on the request"),
    (request("sessions-bad", -1, [b"x"]), "first_msg_id must be >= 1"),
    (request("sessions-bad", 2**63 - 1, [b"x", b"y"]), "overflows the 64-bit message id"),
    (request("sessions-bad", 1, [b"x"], msg_id=1), "give first_msg_id on the request or a msg_id on every record"),
    (request("sessions-bad", 1, [b"x"], idempotency_key="k"), "a first_msg_id batch takes no idempotency_key"),
    (request("sessions-bad", 1, [b"x"], dedup_id="d" * 257), "dedup_id is longer than 256 characters"),
], ids=["no-dedup-id", "negative", "overflow", "with-msg-id", "with-key", "long-dedup-id"])
def test_bad_session_numbers_are_invalid_argument_and_change_nothing(
        cluster: DevCluster, bad: broker_pb2.PublishRequest, message: str) -> None:
    with Client(cluster.addresses) as client:
        client.create_topic("sessions-bad", 1, exist_ok=True)
    s = leader_stubs(cluster)
    try:
        before = ends(s, "sessions-bad"), marks(s, "sessions-bad")
        with pytest.raises(grpc.RpcError) as info:
            s.broker.Publish(bad)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in info.value.details()
        assert (ends(s, "sessions-bad"), marks(s, "sessions-bad")) == before
    finally:
        s.close()


def test_a_batch_by_range_is_refused_for_a_dedup_id_with_per_record_ids(cluster: DevCluster) -> None:
    """Per-record watermarks are kept until reset; a first_msg_id batch would have turned one into a
    session forgotten after the dedup window, and a hot standby resending ids 1..2 then stored them
    twice. From a session by range to per-record ids is allowed (the watermark is then kept)."""
    with Client(cluster.addresses) as client:
        client.create_topic("sessions-forms", 1)
    s = leader_stubs(cluster)
    try:
        def per_record(dedup_id: str, ids: list[int]) -> broker_pb2.PublishResponse:
            return s.broker.Publish(broker_pb2.PublishRequest(topic="sessions-forms", dedup_id=dedup_id, records=[
                broker_pb2.PublishRecord(value=b"v%d" % i, msg_id=i) for i in ids]))

        per_record("standby", [1, 2])
        with pytest.raises(grpc.RpcError) as info:
            s.broker.Publish(request("sessions-forms", 3, [b"v3"], dedup_id="standby"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "has per-record msg_ids (watermark 2)" in info.value.details()
        assert ends(s, "sessions-forms") == [2] and marks(s, "sessions-forms") == {"standby": 2}
        s.broker.Publish(request("sessions-forms", 1, [b"r1"], dedup_id="ranged"))
        assert not per_record("ranged", [2]).results[0].duplicate
        with pytest.raises(grpc.RpcError):
            s.broker.Publish(request("sessions-forms", 3, [b"r3"], dedup_id="ranged"))
        assert ends(s, "sessions-forms") == [4] and marks(s, "sessions-forms") == {"standby": 2, "ranged": 2}
    finally:
        s.close()


def test_a_gap_is_refused_as_out_of_sequence(cluster: DevCluster) -> None:
    with Client(cluster.addresses) as client:
        client.create_topic("sessions-gap", 1)
    s = leader_stubs(cluster)
    try:
        s.broker.Publish(request("sessions-gap", 1, [b"a"]))
        with pytest.raises(grpc.RpcError) as info:
            s.broker.Publish(request("sessions-gap", 3, [b"c"]))
        err = error_from_rpc(info.value)
        assert (err.code, err.reason) == ("INVALID_ARGUMENT", Reason.SESSION_OUT_OF_SEQUENCE)
        assert "its watermark is 1, so the next batch must start at 2" in err.message
        assert ends(s, "sessions-gap") == [1]
    finally:
        s.close()


def test_the_sdk_publishes_in_sessions_from_many_threads_and_recovers_from_a_reset(cluster: DevCluster) -> None:
    with Client(cluster.addresses) as client:
        client.create_topic("sessions-sdk", 2)
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda i: client.publish_batch("sessions-sdk", [b"%d-%d" % (i, j)
                                                                                    for j in range(5)]), range(30)))
        assert all(not r.duplicate for batch in results for r in batch)
        sessions = {m.dedup_id: m.msg_id for m in client.get_watermarks("sessions-sdk")}
        assert sessions and all(d.startswith("sdk-") for d in sessions)
        assert sum(sessions.values()) == 150, "each session's watermark counts exactly its own records"
        for dedup_id in sessions:  # the broker forgets every session: the SDK's next ranges leave a gap
            client.reset_watermark("sessions-sdk", dedup_id)
        after = client.publish_batch("sessions-sdk", [b"after-reset"])
        assert not after[0].duplicate
        client.drop_topic("sessions-sdk")
        client.create_topic("sessions-sdk", 2)  # a new incarnation knows none of the client's sessions
        assert not client.publish("sessions-sdk", b"new topic").duplicate
    wait_converged(cluster)
    stored = [v for p in range(2) for _, v in partition_contents(cluster.grpc_address(0), "sessions-sdk", p)]
    assert stored == [b"new topic"]


def test_the_asyncio_client_publishes_in_sessions_too(cluster: DevCluster) -> None:
    async def run() -> list[str]:
        async with AsyncClient(cluster.addresses) as client:
            await client.create_topic("sessions-aio", 1)
            await asyncio.gather(*(client.publish_batch("sessions-aio", [b"%d" % i] * 3) for i in range(10)))
            return [m.dedup_id for m in await client.get_watermarks("sessions-aio")]

    dedup_ids = asyncio.run(run())
    assert dedup_ids and all(d.startswith("sdk-") for d in dedup_ids)
    s = leader_stubs(cluster)
    try:
        assert ends(s, "sessions-aio") == [30] and sum(marks(s, "sessions-aio").values()) == 30
    finally:
        s.close()


def test_an_ephemeral_topic_takes_the_sdk_default(cluster: DevCluster) -> None:
    with Client(cluster.addresses) as client:
        client.create_topic("sessions-ephemeral", 1, durability="ephemeral")
        assert [r.duplicate for r in client.publish_batch("sessions-ephemeral", [b"a", b"b"])] == [False, False]


def test_session_places_survive_failover_and_a_whole_cluster_restart(fresh_cluster: DevCluster) -> None:
    c = fresh_cluster
    with Client(c.addresses) as client:
        client.create_topic("sessions-survive", 3)
    batch = request("sessions-survive", 1, [b"m%d" % i for i in range(6)])
    s = leader_stubs(c)
    try:
        first = places(s.broker.Publish(batch))
    finally:
        s.close()
    leader = c.leader()
    assert leader is not None
    c.kill(leader)
    c.spawn(leader)
    s = leader_stubs(c)
    try:
        assert places(s.broker.Publish(batch)) == [(p, o, ts, True) for p, o, ts, _ in first], "after failover"
    finally:
        s.close()
    for i in range(c.nodes):
        c.kill(i)
    for i in range(c.nodes):
        c.spawn(i)
    s = leader_stubs(c)
    try:
        assert places(s.broker.Publish(batch)) == [(p, o, ts, True) for p, o, ts, _ in first], "after a restart"
        assert [d for *_, d in places(s.broker.Publish(request("sessions-survive", 7, [b"m6"])))] == [False]
        assert sum(ends(s, "sessions-survive")) == 7
    finally:
        s.close()


def test_an_idle_sdk_session_is_forgotten_after_the_window_and_the_client_carries_on(tmp_path: Path) -> None:
    env = dict(os.environ, RAFTBROKER_HOUSEKEEPING_PERIOD_MS="200")
    c = DevCluster(3, tmp_path, env=env).start()
    try:
        c.wait_ready(60)
        with Client(c.addresses) as client:
            client.create_topic("sessions-idle", 1, dedup_window_ms=1000)
            client.publish_batch("sessions-idle", [b"a", b"b"])
            (first,) = [m.dedup_id for m in client.get_watermarks("sessions-idle")]
            wait_until(lambda: not client.get_watermarks("sessions-idle"), 60,
                       "the housekeeping to forget the idle session")
            results = client.publish_batch("sessions-idle", [b"c"])  # refused as out of sequence, then resent
            assert not results[0].duplicate and results[0].offset == 2
            (second,) = [m.dedup_id for m in client.get_watermarks("sessions-idle")]
            assert second != first, "the client opened a new session"
    finally:
        c.stop()


def test_watermarks_are_read_page_by_page(cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """GetWatermarks answered every session at once: about 38,000 sessions of 256-character ids made
    an answer too large for any client. A page is asked for (limit, after_dedup_id); limit 0 keeps
    answering all, as before."""
    with Client(cluster.addresses) as client:
        client.create_topic("sessions-pages", 1)
        ids = [f"p{i}" for i in range(5)]
        for dedup_id in ids:
            client.publish("sessions-pages", b"x", dedup_id=dedup_id, msg_id=1)
        s = leader_stubs(cluster)
        try:
            def page(limit: int, after: str = "") -> tuple[list[str], bool]:
                got = s.admin.GetWatermarks(admin_pb2.GetWatermarksRequest(
                    topic="sessions-pages", limit=limit, after_dedup_id=after))
                return [m.dedup_id for m in got.watermarks], got.more

            assert page(2) == (["p0", "p1"], True)
            assert page(2, "p1") == (["p2", "p3"], True)
            assert page(2, "p3") == (["p4"], False)
            assert page(0) == (ids, False)
        finally:
            s.close()
        monkeypatch.setattr(wire, "WATERMARKS_PAGE", 2)  # the SDK asks page by page
        assert [(m.dedup_id, m.msg_id) for m in client.get_watermarks("sessions-pages")] == [(i, 1) for i in ids]
