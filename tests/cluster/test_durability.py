"""Durability classes across a whole-cluster kill -9, and large batches (SPEC §2.1, §9)."""

from __future__ import annotations

import functools
import signal
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from broker.client import Client, Message
from broker.core import formats
from broker.devcluster import DevCluster
from broker.services.memory_refill import REFILL_PERIOD_ENV
from broker.v1 import admin_pb2, broker_pb2, common_pb2
from tests.cluster.digests import topic_end_offsets, wait_converged
from tests.cluster.stubs import stubs
from tests.conftest import start_cluster, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

CLASSES = {
    "disk": common_pb2.DURABILITY_DISK,
    "memory": common_pb2.DURABILITY_MEMORY,
    "ephemeral": common_pb2.DURABILITY_EPHEMERAL,
}


def read(address: str, topic: str, **kw: object) -> list[common_pb2.Record | common_pb2.Event]:
    s = stubs(address)
    try:
        out: list[common_pb2.Record | common_pb2.Event] = []
        req = broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True, **kw)  # type: ignore[arg-type]
        for item in s.broker.Subscribe(req, timeout=30):
            out.extend(item.batch.records) if item.HasField("batch") else out.append(item.event)
        return out
    finally:
        s.close()


def test_whole_cluster_kill_keeps_disk_and_metadata_and_tells_readers(tmp_path: Path) -> None:
    c = start_cluster(tmp_path)
    try:
        s = stubs(c.wait_ready())
        tokens = {}
        for name, durability in CLASSES.items():
            s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
                name=name, durability=durability)))
            s.broker.Publish(broker_pb2.PublishRequest(topic=name, records=[
                broker_pb2.PublishRecord(value=b"%s-%d" % (name.encode(), i)) for i in range(100)]))
        for name in CLASSES:
            got = read(c.wait_ready(), name)
            assert len(got) == 100, name
            tokens[name] = got[49].position
        s.close()

        for i in range(c.nodes):
            c.kill(i)
        for i in range(c.nodes):
            c.spawn(i)
        leader = c.wait_ready(60)

        assert [r.value for r in read(leader, "disk")] == [b"disk-%d" % i for i in range(100)]
        s = stubs(leader)
        names = [t.config.name for t in s.admin.ListTopics(admin_pb2.ListTopicsRequest()).topics]
        assert sorted(names) == sorted(CLASSES)  # metadata of every class survives
        s.close()
        for name in ("memory", "ephemeral"):
            assert [x for x in read(leader, name) if isinstance(x, common_pb2.Record)] == [], name
        # a reader resuming inside lost data is told, never silently moved on
        told = read(leader, "memory", **{"from": common_pb2.Position(token=tokens["memory"])})
        assert [e.type for e in told] == [common_pb2.EVENT_TYPE_SKIP_FORWARD]
        resumed = read(leader, "disk", **{"from": common_pb2.Position(token=tokens["disk"])})
        assert [r.offset for r in resumed] == list(range(50, 100))
    finally:
        c.stop()


def wait_format(c: DevCluster) -> None:
    wait_until(lambda: [(v.cluster_format if v else None) for v in map(c.node_status, range(3))] ==
               [formats.CODE_FORMAT] * 3, 60, "the cluster's command format to rise")


def test_a_restarted_node_refuses_what_the_others_refuse_on_a_full_memory_topic(tmp_path: Path) -> None:
    """A `memory` topic keeps its counters on every node: a follower restarted (kill -9) holds none of
    the records, yet it refuses an append to a full `reject` topic as the others do, leading or not,
    and every node keeps the same offsets (docs/design/memory-topics.md; before command format 5 it
    accepted it, and an append it acknowledged as leader was missing from another node)."""
    c = start_cluster(tmp_path)
    try:
        wait_format(c)
        s = stubs(c.wait_ready())
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
            name="full", durability=common_pb2.DURABILITY_MEMORY, full_policy=common_pb2.FULL_POLICY_REJECT,
            retention=common_pb2.Retention(max_records=3))))
        s.broker.Publish(broker_pb2.PublishRequest(topic="full", records=[
            broker_pb2.PublishRecord(value=b"%d" % i) for i in range(3)]))
        s.close()

        def refused(address: str) -> None:
            stub = stubs(address)
            try:
                with pytest.raises(grpc.RpcError) as info:
                    stub.broker.Publish(broker_pb2.PublishRequest(topic="full", records=[
                        broker_pb2.PublishRecord(value=b"more")]), timeout=30)
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
            finally:
                stub.close()

        leader = c.leader()
        assert leader is not None
        restart_a_follower(c)
        refused(c.wait_ready())
        wait_converged(c)
        assert [topic_end_offsets(c.grpc_address(i), "full") for i in range(3)] == [[3]] * 3

        c.kill(leader)  # the restarted follower or the third leads; either refuses
        refused(c.wait_ready(60))
        c.spawn(leader)
        c.wait_answering(leader)
        wait_converged(c)
        assert [topic_end_offsets(c.grpc_address(i), "full") for i in range(3)] == [[3]] * 3
        s = stubs(c.wait_ready())
        try:
            def verdict() -> admin_pb2.VerifyReplicasResponse | None:
                found = s.admin.VerifyReplicas(admin_pb2.VerifyReplicasRequest(), timeout=30)
                return found if all(n.reachable for n in found.nodes) else None  # the restarted one answers

            found = wait_until(verdict, 60, "every member to answer the verification")
            assert isinstance(found, admin_pb2.VerifyReplicasResponse)
            assert found.agreed and not found.differing, found
        finally:
            s.close()
    finally:
        c.stop()


def metric(address: str, name: str) -> float | None:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        for family in text_string_to_metric_families(response.read().decode()):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
    return None


def test_a_rolling_restart_keeps_every_memory_record(tmp_path: Path) -> None:
    """Each node in turn killed with -9 and restarted, each waited for until it serves every record
    again: a restarted node takes back from the others the `memory` records it lost (docs/design/
    memory-topics.md). Before, each restart lost a node's copy, so the third lost them all, and a
    restarted leader told readers and groups to skip what the others still held."""
    c = start_cluster(tmp_path)
    try:
        wait_format(c)
        s = stubs(c.wait_ready())
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
            name="mem", partitions=2, durability=common_pb2.DURABILITY_MEMORY,
            retention=common_pb2.Retention(max_records=2_500))))
        values = [b"%05d:" % i + b"x" * (i % 700) for i in range(3_000)]
        for at in range(0, len(values), 250):
            s.broker.Publish(broker_pb2.PublishRequest(topic="mem", records=[
                broker_pb2.PublishRecord(value=v, key=b"%d" % (i % 7)) for i, v in enumerate(values[at:at + 250], at)]),
                timeout=30)
        s.close()
        expected = {p: [(r.offset, r.value) for r in read(c.wait_ready(), "mem", partition=p)] for p in range(2)}
        assert sum(map(len, expected.values())) == 3_000

        def serves_all(i: int) -> bool:
            try:
                return all([(r.offset, r.value) if isinstance(r, common_pb2.Record) else r.type
                            for r in read(c.grpc_address(i), "mem", partition=p)] == expected[p] for p in range(2))
            except grpc.RpcError:  # e.g. the topic not applied yet on the restarted node
                return False

        for i in range(3):
            c.kill(i)
            c.spawn(i)
            c.wait_answering(i)
            # ready (what a StatefulSet waits for before restarting the next) only once it holds them again
            wait_until(functools.partial(serving, c, i), 60, f"node {i} to be ready")
            if c.leader() != i:  # a leader stays ready meanwhile: it takes writes
                assert serves_all(i), f"node {i} is ready before it took back what it lost"
            wait_until(functools.partial(serves_all, i), 60, f"node {i} to serve every record again")
            assert metric(c.metrics_address(i), "raftbroker_memory_records_lost") == 0
            refilled = metric(c.metrics_address(i), "raftbroker_memory_records_refilled_total")
            assert refilled is not None and refilled > 0
        # a consumer group on whichever node leads now reads them all, with nothing skipped
        got: set[tuple[int, int, bytes]] = set()
        with Client(c.addresses, retry_deadline_s=60) as client, client.subscribe(
                "mem", group="g", stop_at_end=True, max_in_flight=1000) as consumer:
            for item in consumer:
                assert isinstance(item, Message), f"nothing is skipped: {item}"
                got.add((item.partition, item.offset, item.value))
                item.ack()
                if len(got) == 3_000:
                    break
        assert got == {(p, o, v) for p, rows in expected.items() for o, v in rows}
    finally:
        c.stop()


def serving(c: DevCluster, i: int) -> bool:
    """Whether node ``i`` answers gRPC health SERVING (what the StatefulSet's readiness probe asks)."""
    channel = grpc.insecure_channel(c.grpc_address(i))
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
    except grpc.RpcError:
        return False
    finally:
        channel.close()


def restart_a_follower(c: DevCluster) -> int:
    """Kill a follower with -9 and start it again; returns which (it answers, it may not be ready)."""
    leader = c.leader()
    assert leader is not None
    follower = (leader + 1) % 3
    c.kill(follower)
    c.spawn(follower)
    c.wait_answering(follower)
    return follower


def outcome(call: Callable[[], object]) -> tuple[grpc.StatusCode, str] | None:
    """``call``'s status code and details (OK when it answered); None while the node answers
    nothing yet (just elected, it applies what came before its term)."""
    try:
        call()
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        if "just elected" in (exc.details() or ""):
            return None
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def restart_slowly(c: DevCluster, node: int, refill_period_s: int, leader: int | None = None) -> None:
    """Kill ``node`` with -9 and start it again with its first look for lost records
    ``refill_period_s`` away; with ``leader``, wait until it applied what the leader committed."""
    c.kill(node)
    c.env_by_node[node] = {REFILL_PERIOD_ENV: str(refill_period_s)}
    c.spawn(node)
    c.wait_answering(node)
    if leader is not None:
        def caught_up() -> bool:
            mine, theirs = c.node_status(node), c.node_status(leader)
            return mine is not None and theirs is not None and mine.applied_index >= theirs.commit_index

        wait_until(caught_up, 60, "the restarted follower to catch up")


def memory_topic(c: DevCluster, count: int) -> list[bytes]:
    """A `memory` topic "mem" of one partition with ``count`` records; returns their values."""
    wait_format(c)
    s = stubs(c.wait_ready())
    try:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
            name="mem", durability=common_pb2.DURABILITY_MEMORY)))
        values = [b"v%04d" % i for i in range(count)]
        s.broker.Publish(broker_pb2.PublishRequest(topic="mem", records=[
            broker_pb2.PublishRecord(value=v) for v in values]), timeout=30)
        return values
    finally:
        s.close()


def test_a_restarted_node_takes_back_what_the_others_hold_after_a_whole_cluster_restart(tmp_path: Path) -> None:
    """After a whole-cluster restart every node lost the records before it, and holds those written
    since. A follower restarted then takes back those it can: the others answer the older ones with
    SKIP_FORWARD, and it took nothing (the newer ones were lost with the older: audit)."""
    c = start_cluster(tmp_path)
    try:
        memory_topic(c, 500)
        for i in range(3):
            c.kill(i)
        for i in range(3):
            c.spawn(i)
        s = stubs(c.wait_ready(60))
        try:
            s.broker.Publish(broker_pb2.PublishRequest(topic="mem", records=[
                broker_pb2.PublishRecord(value=b"after%03d" % i) for i in range(100)]), timeout=30)
        finally:
            s.close()
        follower = restart_a_follower(c)

        def tail() -> list[object]:
            try:
                got = read(c.grpc_address(follower), "mem")
            except grpc.RpcError:
                return []
            return [(r.type, r.offset_before, r.offset_after) if isinstance(r, common_pb2.Event) else r.value
                    for r in got]

        expected = [(common_pb2.EVENT_TYPE_SKIP_FORWARD, 0, 500), *(b"after%03d" % i for i in range(100))]
        wait_until(lambda: tail() == expected, 60, "the restarted node to serve the records written since")
        wait_until(functools.partial(serving, c, follower), 60, "the node to be ready")
        assert metric(c.metrics_address(follower), "raftbroker_memory_records_lost") == 500, "lost everywhere"
    finally:
        c.stop()


def test_a_stopping_leader_hands_over_to_a_ready_follower(tmp_path: Path) -> None:
    """A follower still taking back what it lost is not ready; a leader stopped with SIGTERM hands the
    leadership to the other one. Before, pysyncobj's choice (the higher address among followers
    equally caught up) took the one taking them back, and its consumer groups skipped every record."""
    c = start_cluster(tmp_path)
    try:
        values = memory_topic(c, 200)
        leader = c.leader()
        assert leader is not None
        followers = [i for i in range(3) if i != leader]
        slow = max(followers, key=c.raft_address)  # the one pysyncobj picked when both are caught up
        restart_slowly(c, slow, 3600, leader)  # it will not have taken them back for an hour
        assert not serving(c, slow), "not ready while it has not taken its records back"
        c.kill(leader, signal.SIGTERM)
        wait_until(lambda: c.leader() is not None, 60, "a new leader")
        new = c.leader()
        assert new != slow, "the leadership went to the follower that is not ready"
        got: list[bytes] = []
        with Client([c.grpc_address(i) for i in followers], retry_deadline_s=60) as client, client.subscribe(
                "mem", group="g", stop_at_end=True, max_in_flight=1000) as consumer:
            for item in consumer:
                assert isinstance(item, Message), f"nothing is skipped: {item}"
                got.append(item.value)
                item.ack()
                if len(got) == len(values):
                    break
        assert sorted(got) == values
    finally:
        c.stop()


def test_a_leader_still_taking_records_back_holds_its_groups_and_routes_until_they_are_back(
        tmp_path: Path) -> None:
    """A node elected while it still takes back its `memory` records (here the only one that can
    win: the other follower's log is behind) delivers nothing of those partitions to its consumer
    groups, and routes nothing of them, until the records are back, then all of them. Before, it
    told the group SKIP_FORWARD at once, and the group moved past 300 records the other follower
    held, for good; a route counted them lost and copied the 10 it held."""
    c = start_cluster(tmp_path)
    try:
        values = memory_topic(c, 300)
        s = stubs(c.wait_ready())
        try:
            s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="copy")))
        finally:
            s.close()
        leader = c.leader()
        assert leader is not None
        slow, other = (leader + 1) % 3, (leader + 2) % 3
        restart_slowly(c, slow, 45, leader)  # its first look for lost records comes in 45 s
        s = stubs(c.grpc_address(leader))
        try:  # a record leased on this leader, discarded later through the next one
            stream = s.broker.Subscribe(broker_pb2.SubscribeRequest(topic="mem", group="d", max_in_flight=1),
                                        timeout=30)
            leased = next(r for r in stream if r.HasField("batch")).batch.records[0]
            stream.cancel()
        finally:
            s.close()
        c.kill(other, signal.SIGSTOP)  # it misses the next records: it cannot win the next election
        try:
            late = [b"late%d" % i for i in range(10)]
            s = stubs(c.grpc_address(leader))
            try:
                s.broker.Publish(broker_pb2.PublishRequest(topic="mem", records=[
                    broker_pb2.PublishRecord(value=v) for v in late]), timeout=30)
            finally:
                s.close()
            c.kill(leader)
        finally:
            c.kill(other, signal.SIGCONT)
        wait_until(lambda: c.leader() == slow, 60, "the restarted node to be elected")
        assert metric(c.metrics_address(slow), "raftbroker_memory_records_refilled_total") == 0, \
            "it leads before it took anything back"
        s = stubs(c.grpc_address(slow))
        discard = broker_pb2.DiscardRequest(topic="mem", group="d", positions=[leased.position], reason="bad")
        try:
            answer = wait_until(lambda: outcome(lambda: s.broker.Discard(discard, timeout=30)), 30,
                                "the new leader to answer a discard")
            assert isinstance(answer, tuple)
            code, message = answer
            assert code == grpc.StatusCode.UNAVAILABLE and "still taking back" in message, (code, message)
        finally:
            s.close()
        got: list[bytes] = []
        with Client([c.grpc_address(slow)], retry_deadline_s=60) as client:
            client.create_route("r", "mem", "copy")  # it starts at the source's first offset: in what was lost
            with client.subscribe("mem", group="g", max_in_flight=1000) as consumer:
                for item in consumer:
                    assert isinstance(item, Message), f"nothing is skipped: {item}"
                    got.append(item.value)
                    item.ack()
                    if len(got) == len(values) + len(late):
                        break
            assert sorted(got) == sorted(values + late)
            assert metric(c.metrics_address(slow), "raftbroker_memory_records_refilled_total") == 300
            wait_until(lambda: client.route("r").copied == len(values) + len(late), 60, "the route to copy all")
            assert client.route("r").lost == 0
        s = stubs(c.grpc_address(slow))
        try:  # now it holds the record: the discard dead-letters it with its body (before: an empty one)
            s.broker.Discard(discard, timeout=30)
            [dead] = s.admin.ListDeadLetters(admin_pb2.ListDeadLettersRequest(topic="mem", group="d"),
                                             timeout=30).dead_letters
            assert (dead.offset, dead.record.value) == (leased.offset, leased.value) == (0, values[0])
        finally:
            s.close()
        assert sorted(r.value for r in read(c.grpc_address(slow), "copy") if isinstance(r, common_pb2.Record)) == \
            sorted(values + late)
    finally:
        c.stop()


def test_a_follower_taking_records_back_lets_another_win_the_election(tmp_path: Path) -> None:
    """A leader killed with -9 cannot choose its successor: a follower still taking back its `memory`
    records starts no election of its own (for 5 s at most), so the one that holds them wins. Twice,
    each with the other follower ready; before, the first to time out won (one in two)."""
    c = start_cluster(tmp_path)
    try:
        memory_topic(c, 200)
        leader = c.leader()
        assert leader is not None
        slow = (leader + 1) % 3
        restart_slowly(c, slow, 3600)  # it will not have taken them back for an hour
        for _ in range(2):
            wait_until(lambda: c.leader() is not None, 60, "every node to agree on the leader")
            old = c.leader()
            assert old is not None and old != slow
            other = 3 - old - slow
            wait_until(functools.partial(serving, c, other), 60, "the other follower to be ready")
            wait_until(lambda: (c.node_status(slow) or admin_pb2.NodeInfo()).role == "follower", 60,
                       "the slow node to follow")
            c.kill(old)
            wait_until(lambda: c.leader() is not None, 60, "a new leader")
            assert c.leader() == other, "the node still taking records back was elected"
            c.spawn(old)
            c.wait_answering(old)
    finally:
        c.stop()


def test_a_leader_restarted_with_uncommitted_entries_takes_its_records_back(tmp_path: Path) -> None:
    """A leader cut off from its followers (SIGSTOP) takes appends nobody commits, then is killed
    with -9. Restarted, its journal ends in entries the new leader's log replaced: it counted itself
    replaying until the cluster's log grew past them, took nothing back and was not ready (an audit:
    45 s with 40 of them, hours on an idle cluster). The truncation now ends the replay."""
    c = start_cluster(tmp_path)
    try:
        values = memory_topic(c, 300)
        leader = c.leader()
        assert leader is not None
        followers = [i for i in range(3) if i != leader]
        for i in followers:
            c.kill(i, signal.SIGSTOP)
        try:
            def publish(k: int) -> None:
                s = stubs(c.grpc_address(leader))
                try:
                    s.broker.Publish(broker_pb2.PublishRequest(topic="mem", records=[
                        broker_pb2.PublishRecord(value=b"pending%d" % k)]), timeout=3)
                except grpc.RpcError:
                    pass  # never committed: no quorum
                finally:
                    s.close()

            pending = [threading.Thread(target=publish, args=(k,)) for k in range(40)]
            for thread in pending:
                thread.start()
            wait_until(lambda: (metric(c.metrics_address(leader), "raftbroker_raft_follower_lag_entries") or 0) >= 40,
                       30, "the cut-off leader to hold the 40 appends its followers lack")
            c.kill(leader)
            for thread in pending:
                thread.join()
        finally:
            for i in followers:
                c.kill(i, signal.SIGCONT)
        c.wait_ready(60)
        c.spawn(leader)
        c.wait_answering(leader)
        wait_until(functools.partial(serving, c, leader), 30, "the restarted node to be ready")
        got = [r.value for r in read(c.grpc_address(leader), "mem") if isinstance(r, common_pb2.Record)]
        assert got[:300] == values, "it took its records back"
        assert metric(c.metrics_address(leader), "raftbroker_memory_records_lost") == 0
    finally:
        c.stop()


def test_large_batches_replicate(tmp_path: Path) -> None:
    """A 4 MiB publish batch and a 1 MiB record are committed on every node."""
    c = start_cluster(tmp_path)
    try:
        leader = c.wait_ready()
        s = stubs(leader)
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="big")))
        batch = [broker_pb2.PublishRecord(value=bytes([i % 256]) * (64 << 10)) for i in range(64)]  # 4 MiB
        assert len(s.broker.Publish(broker_pb2.PublishRequest(topic="big", records=batch), timeout=30).results) == 64
        one_mib = broker_pb2.PublishRecord(value=b"x" * ((1 << 20) - 64))  # at the limit with its framing
        s.broker.Publish(broker_pb2.PublishRequest(topic="big", records=[one_mib]), timeout=30)
        with pytest.raises(grpc.RpcError) as info:
            s.broker.Publish(broker_pb2.PublishRequest(topic="big", records=[
                broker_pb2.PublishRecord(value=b"x" * ((1 << 20) + 1))]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        s.close()
        wait_converged(c)
        for i in range(c.nodes):
            got = read(c.grpc_address(i), "big", max_batch=4)
            assert len(got) == 65, f"node {i} has {len(got)} records"
            assert all(r.value == bytes([j % 256]) * (64 << 10) for j, r in enumerate(got[:64]))
            assert got[64].value == one_mib.value
    finally:
        c.stop()


def test_graceful_stop_of_the_leader_hands_leadership_over(tmp_path: Path) -> None:
    import signal

    c = start_cluster(tmp_path)
    try:
        old = c.leader()
        assert old is not None
        c.kill(old, signal.SIGTERM)
        assert "handed leadership over" in c.log_path(old).read_text()
        wait_until(lambda: c.leader() is not None, 10, "the new leader")
        assert c.leader() != old
    finally:
        c.stop()
