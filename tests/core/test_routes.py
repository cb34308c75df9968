"""Routes in the core (SPEC §3.4): replicated definitions and cursors, cycle refusal, and the
router's filter, partition key, op list, FIFO per source partition, origin, idempotent retries,
echo prevention and poison records, over the in-memory replicator."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from broker.clock import NodeClock
from broker.core import errors, formats
from broker.core.applied import Rejected
from broker.core.members import Peer
from broker.core.retention import Retention
from broker.core.routes import RouteTable, find_cycle
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.partitioning import partition_for_key
from broker.leader.reading import Reader
from broker.leader.route_admin import RouteAdmin
from broker.leader.route_copies import Copy, idempotency_key
from broker.leader.routed_append import TrustedAppender
from broker.leader.router import RouteRunner
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.replication.memory import InMemoryReplicator
from broker.services import wire
from broker.storage import Column
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, common_pb2, internal_pb2, routes_internal_pb2
from tests.conftest import wait_until
from tests.core.wire_inputs import publish_request

pytestmark = pytest.mark.unit


@dataclass
class FakeRemote:
    """A remote cluster that records what it was sent."""

    cluster: str
    sent: list[tuple[str, list[Copy]]] = field(default_factory=list)

    def cluster_id(self) -> str:
        return self.cluster

    def append(self, topic: str, copies: Sequence[Copy]) -> None:
        self.sent.append((topic, list(copies)))

    def close(self) -> None:
        pass


@dataclass
class Env:
    state: BrokerStateMachine
    log: TopicLog
    reader: Reader
    table: RouteTable
    admin: RouteAdmin
    runner: RouteRunner
    appender: TrustedAppender
    remote: FakeRemote
    submitter: CommandSubmitter

    def drain(self) -> None:
        for _ in range(100):
            if not self.runner.run_once():
                return
        raise AssertionError("the router never caught up")


@pytest.fixture
def env() -> Iterator[Env]:
    state = BrokerStateMachine(MemoryStore(), Changes())
    Retention(state)
    table = RouteTable(state)
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = CommandSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    clock = NodeClock()  # the real wall clock, as a node has
    log = TopicLog(state, submitter, Limits(), "east/n1", clock)
    appender = TrustedAppender(state, submitter, Limits(), "east", clock)
    remote = FakeRemote("west")
    runner = RouteRunner(state, table, appender, submitter, lambda: True, lambda addresses: remote,
                         batch_records=7)
    yield Env(state, log, Reader(state), table, RouteAdmin(state, table, submitter, clock, runner), runner, appender,
              remote, submitter)
    replicator.close()


def create(env: Env, name: str, partitions: int = 1, **config: object) -> None:
    env.log.create_topic(internal_pb2.TopicConfig(name=name, partitions=partitions, **config))  # type: ignore[arg-type]


def publish(env: Env, topic: str, docs: Sequence[Mapping[str, object]], **kw: object) -> None:
    env.log.publish(publish_request(topic=topic, records=[
        broker_pb2.PublishRecord(value=json.dumps(d).encode(), **kw) for d in docs]))  # type: ignore[arg-type]


def read(env: Env, topic: str) -> list[common_pb2.Record]:
    out: list[common_pb2.Record] = []
    for item in env.reader.subscribe(wire.subscription(broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True)),
                                     lambda: True):
        assert item.HasField("batch"), item
        out.extend(item.batch.records)
    return out


def route(name: str, source: str, target: str, **kw: object) -> internal_pb2.RouteConfig:
    return internal_pb2.RouteConfig(name=name, source=source, target=target, **kw)  # type: ignore[arg-type]


def test_find_cycle_follows_local_routes_only() -> None:
    a_b, b_c = route("r1", "a", "b"), route("r2", "b", "c")
    assert find_cycle([a_b, b_c], route("r3", "c", "a")) == ["c", "a", "b", "c"]
    assert find_cycle([a_b], route("r3", "a", "a")) == ["a", "a"]
    assert find_cycle([a_b, b_c], route("r3", "c", "d")) is None
    remote = route("m", "b", "a", target_cluster=["h:1"])
    assert find_cycle([a_b], remote) is None
    assert find_cycle([a_b, remote], route("r3", "b", "c")) is None


def test_route_with_filter_and_partition_key_copies_in_order_and_keeps_origin(env: Env) -> None:
    create(env, "src", 2)
    create(env, "dst", 3)
    docs = [{"n": i, "kind": "a" if i % 3 else "b", "user": f"u{i % 5}"} for i in range(40)]
    for p in (0, 1):
        publish(env, "src", [d for d in docs if d["n"] % 2 == p], partition=p)
    info = env.admin.create(route("r", "src", "dst", filter='value.kind == "a"', partition_key="value.user"))
    assert info.lag == 40 and info.meta.route_id == 1
    env.drain()
    copied = read(env, "dst")
    expected = [d for d in docs if d["kind"] == "a"]
    assert sorted(json.loads(r.value)["n"] for r in copied) == [d["n"] for d in expected]
    for r in copied:
        doc = json.loads(r.value)
        assert r.partition == partition_for_key(str(doc["user"]).encode(), 3), "the partition key is applied"
        assert r.origin == "east/n1"
    for p in (0, 1):  # FIFO per source partition, inside every target partition
        for target in range(3):
            ns = [n for r in copied if r.partition == target and (n := json.loads(r.value)["n"]) % 2 == p]
            assert ns == sorted(ns)
    (after,) = env.admin.list()
    assert after.lag == 0 and after.copied == len(expected) and after.skipped == 40 - len(expected)
    assert [(p, next_offset) for p, next_offset, _ in after.partitions] == [(0, 20), (1, 20)]


def test_a_retry_after_a_lost_cursor_stores_nothing_twice(env: Env) -> None:
    create(env, "src")
    create(env, "dst")
    publish(env, "src", [{"n": i} for i in range(10)])
    env.admin.create(route("r", "src", "dst"))
    env.drain()
    # a new leader whose applied cursor lags behind the copies: forget the cursor in the store
    batch = env.state.store.batch()
    batch.delete_range(Column.META, b"rcur/", b"rcur0")
    env.state.store.write(batch)
    env.drain()
    assert [json.loads(r.value)["n"] for r in read(env, "dst")] == list(range(10))


def test_ops_list_and_key_fallback(env: Env) -> None:
    create(env, "src")
    create(env, "dst", 4)
    records = [broker_pb2.PublishRecord(value=b'{"x": 1}', key=b"k%d" % i, op=op)
               for i, op in enumerate([common_pb2.OP_INSERT, common_pb2.OP_DELETE, common_pb2.OP_UPDATE])]
    env.log.publish(publish_request(topic="src", records=records))
    env.admin.create(route("r", "src", "dst", ops=[common_pb2.OP_INSERT, common_pb2.OP_UPDATE],
                           partition_key="value.missing"))
    env.drain()
    copied = read(env, "dst")
    assert sorted(r.key for r in copied) == [b"k0", b"k2"]
    for r in copied:  # the expression failed: the record's own key places it
        assert r.partition == partition_for_key(r.key, 4)


def test_create_refuses_cycles_bad_expressions_and_missing_topics(env: Env) -> None:
    for name in ("a", "b", "c"):
        create(env, name)
    env.admin.create(route("ab", "a", "b"))
    env.admin.create(route("bc", "b", "c"))
    with pytest.raises(errors.FailedPrecondition, match="c -> a -> b -> c"):
        env.admin.create(route("ca", "c", "a"))
    with pytest.raises(errors.FailedPrecondition):
        env.admin.create(route("aa", "a", "a"))
    with pytest.raises(errors.AlreadyExists):
        env.admin.create(route("ab", "a", "c"))
    with pytest.raises(errors.InvalidArgument, match="filter"):
        env.admin.create(route("x", "a", "c", filter="value.n =="))
    with pytest.raises(errors.InvalidArgument, match="partition_key"):
        env.admin.create(route("x", "a", "c", partition_key="nope + 1"))
    with pytest.raises(errors.TopicNotFound):
        env.admin.create(route("x", "a", "missing"))
    with pytest.raises(errors.InvalidArgument, match="host:port"):
        env.admin.create(route("x", "a", "c", target_cluster=["nohost"]))
    # the state machine repeats the cycle check, so a create racing another cannot close one
    cmd = internal_pb2.Command(create_route=routes_internal_pb2.CreateRouteCommand(config=route("ca", "c", "a")))
    result = env.submitter.submit(cmd)
    assert isinstance(result, Rejected) and isinstance(result.error, errors.FailedPrecondition)
    env.admin.delete("bc")
    env.admin.create(route("ca", "c", "a"))  # no longer a cycle
    with pytest.raises(errors.NotFound):
        env.admin.delete("bc")


def test_remote_route_skips_records_from_the_target_cluster(env: Env) -> None:
    create(env, "src", 2)
    publish(env, "src", [{"n": 1}, {"n": 2}], partition=0)
    west = internal_pb2.RecordBody(value=b'{"n": 3}', origin="west/n2").SerializeToString()
    env.appender.append("src", [Copy(west, None, 1, "k-west")], foreign=True)
    env.admin.create(route("m", "src", "mirror", target_cluster=["127.0.0.1:1"]))
    env.drain()
    (topic, copies), = env.remote.sent
    assert topic == "mirror"
    assert [json.loads(internal_pb2.RecordBody.FromString(c.body).value)["n"] for c in copies] == [1, 2]
    assert all(internal_pb2.RecordBody.FromString(c.body).origin == "east/n1" for c in copies)
    assert copies[0].idempotency_key == idempotency_key("east", 1, 1, 0, 0)
    with pytest.raises(errors.InvalidArgument, match="never brings a record back"):
        own = internal_pb2.RecordBody(value=b"{}", origin="east/n1").SerializeToString()
        env.appender.append("src", [Copy(own, None, 0, "k-own")], foreign=True)


def test_a_failed_remote_route_identifies_its_target_cluster_again(env: Env) -> None:
    """A remote cluster's id is not remembered past a failure: the addresses first answered as this
    very cluster (e.g. a remote started with the same cluster id); once a cluster of another id
    runs there, the retry copies, without re-creating the route."""
    create(env, "src")
    publish(env, "src", [{"n": 1}])
    answers = [FakeRemote("east"), env.remote]  # this cluster's own id first, then "west"
    made: list[FakeRemote] = []

    def connect(addresses: list[str]) -> FakeRemote:
        made.append(answers[min(len(made), len(answers) - 1)])
        return made[-1]

    runner = RouteRunner(env.state, env.table, env.appender, env.submitter, lambda: True, connect)
    env.admin.create(route("m", "src", "mirror", target_cluster=["127.0.0.1:1"]))
    assert runner.run_once() is False
    assert "the target cluster is this cluster" in runner.stats["m"].last_error
    runner.stats["m"].retry_at = 0.0  # the backoff is over
    assert runner.run_once() is True
    assert runner.stats["m"].last_error == "" and len(made) == 2
    (topic, copies), = env.remote.sent
    assert topic == "mirror" and len(copies) == 1


def test_records_the_target_refuses_are_skipped_and_counted(env: Env) -> None:
    create(env, "src")
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    create(env, "dst", schema_json=schema)
    publish(env, "src", [{"n": 1}, {"n": "two"}, {"n": 3}])
    env.admin.create(route("r", "src", "dst"))
    env.drain()
    assert [json.loads(r.value)["n"] for r in read(env, "dst")] == [1, 3]
    (info,) = env.admin.list()
    assert info.copied == 2 and info.skipped == 1 and info.lag == 0
    assert info.lost == 1, "a refusal is told apart from a filter's no"


def test_advance_never_moves_a_cursor_back(env: Env) -> None:
    create(env, "src")
    publish(env, "src", [{"n": i} for i in range(5)])
    create(env, "dst")
    meta = env.admin.create(route("r", "src", "dst"))
    env.drain()
    back = internal_pb2.Command(advance_route=routes_internal_pb2.AdvanceRouteCommand(
        name="r", route_id=meta.meta.route_id, source_topic_id=1, partitions=[0], next_offsets=[2]))
    env.submitter.submit(back)
    assert env.table.cursors("r") == {0: (1, 5)}


def test_a_routes_counts_are_replicated_from_format_5_and_a_stale_advance_adds_nothing(env: Env) -> None:
    """ListRoutes answered the leader's router's counts since it took over: a new leader started at 0.
    From command format 5 each advance carries its pass's counts into replicated totals."""
    create(env, "src")
    create(env, "dst", schema_json=json.dumps({"type": "object", "required": ["n"]}))
    publish(env, "src", [{"n": 1}, {"x": 2}])
    meta = env.admin.create(route("r", "src", "dst"))
    env.drain()
    assert env.table.totals("r") is None, "format 0: the leader's own counts only"
    env.submitter.submit(formats.set_format_command(formats.ROUTE_TOTALS_FORMAT))
    publish(env, "src", [{"n": 3}, {"x": 4}, {"n": 5}])
    env.drain()
    assert env.table.totals("r") == (2, 1, 1)
    env.runner.stats.clear()  # another leader: its router has counted nothing
    (info,) = env.admin.list()
    assert (info.copied, info.skipped, info.lost) == (2, 1, 1), "the replicated totals"
    assert (env.admin.local_views()[0].copied, env.admin.local_views()[0].lost) == (0, 0), "metrics: this node's"
    passed = routes_internal_pb2.AdvanceRouteCommand(name="r", route_id=meta.meta.route_id, source_topic_id=1,
                                                     partitions=[0], next_offsets=[4], copied=9)
    stale = internal_pb2.Command(format=formats.ROUTE_TOTALS_FORMAT, advance_route=passed)
    env.submitter.submit(stale)  # a pass over records an advance already passed: counted once
    assert env.table.totals("r") == (2, 1, 1)
    env.admin.delete("r")
    assert env.table.totals("r") is None


def test_a_stored_route_with_a_refused_filter_is_paused_without_evaluating(env: Env) -> None:
    """A route stored before the expression checks existed (written here straight into the replicated
    state, as an old data dir holds it) must not freeze the new leader's router: paused, not run."""
    create(env, "src")
    create(env, "dst")
    publish(env, "src", [{"n": 1}])
    items = "[" + ",".join(str(i) for i in range(300)) + "]"
    issue_filter = f"{items}.all(partition, {items}.all(timestamp_ms, {items}.all(op, true)))"
    cmd = internal_pb2.Command(create_route=routes_internal_pb2.CreateRouteCommand(
        config=route("old", "src", "dst", filter=issue_filter)))
    assert isinstance(env.submitter.submit(cmd), routes_internal_pb2.RouteMeta)
    assert env.runner.run_once() is False
    stats = env.runner.stats["old"]
    assert stats.paused and stats.last_error.startswith("paused:") and "literal" in stats.last_error
    assert env.admin.list()[0].last_error == stats.last_error
    assert env.runner.run_once() is False and read(env, "dst") == []  # still paused, nothing copied
    env.admin.delete("old")  # a re-created route starts afresh
    env.admin.create(route("new", "src", "dst", filter="value.n == 1"))
    env.drain()
    assert [json.loads(r.value) for r in read(env, "dst")] == [{"n": 1}]


def test_without_routes_applies_do_not_wake_the_router_and_a_created_route_does(env: Env) -> None:
    """The router thread runs a pass per state change only while routes exist: publishes on a cluster
    without routes leave it asleep (its long idle wake is set far beyond the test); creating a route
    wakes it at once and the records already stored are copied."""
    runner = RouteRunner(env.state, env.table, env.appender, env.submitter, lambda: True,
                         lambda addresses: env.remote, wake_s=600.0)
    admin = RouteAdmin(env.state, env.table, env.submitter, NodeClock(), runner)
    create(env, "src")
    create(env, "dst")
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while runner.passes < 1:
            assert time.monotonic() < deadline, "the router never ran its first pass"
            time.sleep(0.01)
        version = env.state.version
        for i in range(30):
            publish(env, "src", [{"n": i}])
            time.sleep(0.005)  # not a wait for state: lets a woken router thread take the GIL
        assert env.state.version >= version + 30  # every publish changed the state (and notified)
        assert runner.passes == 1  # ...and none of them woke the router
        admin.create(route("r", "src", "dst"))
        deadline = time.monotonic() + 10
        while len(read(env, "dst")) < 30:
            assert time.monotonic() < deadline, "the created route copied nothing"
            time.sleep(0.01)
        assert [json.loads(r.value)["n"] for r in read(env, "dst")] == list(range(30))
    finally:
        runner.stop()


@dataclass
class HeldRemote:
    """A remote cluster whose appends hang (as towards an unreachable cluster) until it is closed,
    which makes the call in flight fail, as closing a gRPC channel does."""

    entered: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)

    def cluster_id(self) -> str:
        return "west"

    def append(self, topic: str, copies: Sequence[Copy]) -> None:
        self.entered.set()
        self.closed.wait(60)
        raise errors.Unavailable("cancelled: the connection was closed")

    def close(self) -> None:
        self.closed.set()


def router_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """The router threads (the router's and its lanes') running now that were not in ``before``."""
    return [t for t in threading.enumerate()
            if t not in before and (t.name == "router" or t.name.startswith("router-"))]


def copied_through(env: Env, topic: str, n: int) -> bool:
    """``topic`` holds the copies of the records numbered 0 to ``n``, in order."""
    return [json.loads(r.value)["n"] for r in read(env, topic)] == list(range(n + 1))


def test_a_hung_remote_route_holds_up_neither_local_routes_nor_stop(env: Env) -> None:
    """The routes to a remote cluster run on a thread of their own: while an append to it hangs,
    a local route keeps copying each new record; stop cancels the hung call and joins every thread."""
    before = set(threading.enumerate())
    remotes: list[HeldRemote] = []

    def connect(addresses: list[str]) -> HeldRemote:
        remotes.append(HeldRemote())
        return remotes[-1]

    runner = RouteRunner(env.state, env.table, env.appender, env.submitter, lambda: True, connect, wake_s=0.05)
    admin = RouteAdmin(env.state, env.table, env.submitter, NodeClock(), runner)
    create(env, "src")
    create(env, "dst")
    runner.start()
    try:
        admin.create(route("m", "src", "mirror", target_cluster=["127.0.0.1:1"]))
        admin.create(route("r", "src", "dst"))
        publish(env, "src", [{"n": 0}])
        wait_until(lambda: remotes and remotes[0].entered.is_set(), 10, "the remote route to call its cluster")
        for n in range(1, 6):  # one by one: each is copied while the remote call still hangs
            publish(env, "src", [{"n": n}])
            wait_until(functools.partial(copied_through, env, "dst", n), 10, f"record {n} copied")
        assert not remotes[0].closed.is_set() and env.table.cursors("m") == {}
        assert {t.name for t in router_threads(before)} == {"router", "router-127.0.0.1:1"}
    finally:
        started = time.monotonic()
        runner.stop()
    assert time.monotonic() - started < 5, "stop waited for the hung call"
    assert all(r.closed.is_set() for r in remotes)
    assert router_threads(before) == [] and runner.lane_threads() == []
    assert env.table.cursors("m") == {}, "nothing acknowledged: the remote route's cursor never moved"


def test_a_lane_ends_when_leadership_is_lost_or_its_routes_are_deleted(env: Env) -> None:
    before = set(threading.enumerate())
    leading = threading.Event()
    leading.set()
    runner = RouteRunner(env.state, env.table, env.appender, env.submitter, leading.is_set,
                         lambda addresses: FakeRemote("west"), wake_s=0.05)
    admin = RouteAdmin(env.state, env.table, env.submitter, NodeClock(), runner)
    create(env, "src")
    runner.start()
    try:
        admin.create(route("m", "src", "mirror", target_cluster=["127.0.0.1:1"]))
        wait_until(lambda: len(runner.lane_threads()) == 1, 10, "a lane for the remote cluster")
        leading.clear()
        wait_until(lambda: runner.lane_threads() == [], 10, "the lane to end with leadership")
        assert [t.name for t in router_threads(before)] == ["router"]
        leading.set()
        wait_until(lambda: len(runner.lane_threads()) == 1, 10, "a lane again once leading")
        admin.delete("m")
        runner.wake()
        wait_until(lambda: runner.lane_threads() == [], 10, "the lane to end with its last route")
    finally:
        runner.stop()
    assert router_threads(before) == []


@dataclass
class FlakyRemote:
    """A remote cluster that refuses every append while ``down`` is set, and records what it took."""

    down: threading.Event = field(default_factory=threading.Event)
    taken: list[Copy] = field(default_factory=list)
    connections: int = 0

    def connect(self, addresses: list[str]) -> FlakyRemote:
        self.connections += 1
        return self

    def cluster_id(self) -> str:
        return "west"

    def append(self, topic: str, copies: Sequence[Copy]) -> None:
        if self.down.is_set():
            raise errors.Unavailable("the remote cluster is unreachable")
        self.taken.extend(copies)

    def close(self) -> None:
        pass


def test_a_remote_that_fails_then_recovers_continues_from_its_committed_progress(env: Env) -> None:
    """A lane's failed appends leave the cursor where the last acknowledged batch put it; once the
    cluster answers again the route goes on from there: every record sent once acknowledged, in order."""
    remote = FlakyRemote()
    runner = RouteRunner(env.state, env.table, env.appender, env.submitter, lambda: True, remote.connect,
                         batch_records=7, wake_s=0.05)
    admin = RouteAdmin(env.state, env.table, env.submitter, NodeClock(), runner)
    create(env, "src")
    publish(env, "src", [{"n": i} for i in range(10)])
    runner.start()
    try:
        meta = admin.create(route("m", "src", "mirror", target_cluster=["127.0.0.1:1"])).meta
        wait_until(lambda: env.table.cursors("m") == {0: (1, 10)}, 10, "the first records mirrored")
        remote.down.set()
        publish(env, "src", [{"n": i} for i in range(10, 20)])
        wait_until(lambda: "unreachable" in runner.stats["m"].last_error, 10, "an append to fail")
        assert env.table.cursors("m") == {0: (1, 10)}, "a failed append never moves the cursor"
        remote.down.clear()
        wait_until(lambda: env.table.cursors("m") == {0: (1, 20)}, 10, "the route to recover")
        wait_until(lambda: runner.stats["m"].last_error == "", 10, "the error to clear")
    finally:
        runner.stop()
    assert [c.idempotency_key for c in remote.taken] == [idempotency_key("east", meta.route_id, 1, 0, offset)
                                                         for offset in range(20)]
    assert remote.connections >= 2, "a failure drops the connection: the retry connects again"
    assert runner.stats["m"].copied == 20
