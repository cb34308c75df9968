"""``CommandSubmitter.submit_async`` and ``TopicLog.publish_placed_async`` (issue 15 item 6): the same
bound, errors and messages as the sync path, and nothing left behind by a caller that gave up.

The replicator is the in-memory one; :class:`HeldReplicator` holds its submits back until the test
releases them (a command the cluster has not committed yet), which is how a commit timeout and a
late outcome are made deterministic here."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from broker.clock import ManualClock
from broker.core import errors
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, PublishBatch, Published, TopicLog
from broker.replication import Callback, FailReason, ReplicaStatus, ReplicationError
from broker.replication.memory import InMemoryReplicator
from broker.services.errors import status_for
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, internal_pb2
from tests.core.wire_inputs import publish_request

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
TIMEOUT_S = 0.2  # the commit bound of these tests: only ever waited out, never raced


class HeldReplicator:
    """The in-memory replicator, except that a submit waits in :attr:`held` until :meth:`release`
    (applied then) or :meth:`fail` (refused with a :class:`ReplicationError`); while ``holding`` is off,
    submits go straight through."""

    def __init__(self, inner: InMemoryReplicator) -> None:
        self.inner = inner
        self.holding = False
        self.ready = True  # False: a leader elected before it applied what earlier terms committed
        self.held: list[tuple[bytes, Callback, bool]] = []

    def submit(self, command: bytes, callback: Callback, *, sync: bool = False) -> None:
        if self.holding:
            self.held.append((command, callback, sync))
        else:
            self.inner.submit(command, callback, sync=sync)

    def release(self) -> None:
        held, self.held = self.held, []
        for command, callback, sync in held:
            self.inner.submit(command, callback, sync=sync)

    def fail(self, error: ReplicationError) -> None:
        held, self.held = self.held, []
        for _, callback, _ in held:
            callback(None, error)

    def status(self) -> ReplicaStatus:
        return dataclasses.replace(self.inner.status(), leader_ready=self.ready)


class Env:
    def __init__(self) -> None:
        self.state = BrokerStateMachine(MemoryStore(), Changes())
        self.memory = InMemoryReplicator(self.state)
        self.memory.start()
        self.replicator = HeldReplicator(self.memory)
        peers = PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")])
        self.submitter = CommandSubmitter(self.replicator, peers, TIMEOUT_S)  # type: ignore[arg-type]
        self.log = TopicLog(self.state, self.submitter, Limits(record_bytes_max=1000, batch_bytes_max=5000),
                            "c/n1", ManualClock())
        self.loop = asyncio.new_event_loop()
        self.loop_errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _, context: self.loop_errors.append(context))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def settle(self) -> None:
        """Let callbacks handed to the loop run."""
        self.run(asyncio.sleep(0))
        self.run(asyncio.sleep(0))


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    if not e.loop.is_closed():
        e.loop.close()
    e.memory.close()


def _command(topic_id: int = 1) -> internal_pb2.Command:
    return internal_pb2.Command(expire_dedup=internal_pb2.ExpireDedupCommand(now_ms=topic_id))


def _refused(call: Callable[[], object]) -> errors.BrokerError:
    with pytest.raises(errors.BrokerError) as raised:
        call()
    return raised.value


def test_a_commit_timeout_is_unavailable_with_the_sync_message(env: Env) -> None:
    env.replicator.holding = True
    sync = _refused(lambda: env.submitter.submit(_command()))
    asynchronous = _refused(lambda: env.run(env.submitter.submit_async(_command())))
    assert type(asynchronous) is type(sync) is errors.Unavailable
    assert str(asynchronous) == str(sync)
    assert str(sync).startswith(f"not committed within {TIMEOUT_S:g} s (quorum lost or overloaded)")
    code, message, _ = status_for(asynchronous)
    assert (code, message) == (grpc.StatusCode.UNAVAILABLE, str(sync))
    # the outcomes arrive late: for the async caller, after the bound; then after the loop closed
    env.replicator.release()
    env.settle()
    env.replicator.holding = True
    with pytest.raises(errors.Unavailable):
        env.run(env.submitter.submit_async(_command(2)))
    env.loop.close()
    env.replicator.release()  # call_soon_threadsafe on a closed loop: dropped, nothing raised
    assert env.loop_errors == []


def test_a_cancelled_caller_leaves_nothing_that_raises_later(env: Env) -> None:
    env.replicator.holding = True

    async def give_up() -> None:
        task = asyncio.ensure_future(env.submitter.submit_async(_command()))
        await asyncio.sleep(0)
        assert env.replicator.held, "submitted"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    env.run(give_up())
    env.replicator.release()
    env.settle()
    assert env.loop_errors == []


@pytest.mark.parametrize(("reason", "kind"), [
    (FailReason.QUEUE_FULL, errors.ResourceExhausted), (FailReason.TOO_LARGE, errors.InvalidArgument),
    (FailReason.DISCARDED, errors.Unavailable), (FailReason.NOT_LEADER, errors.NotLeader),
    (FailReason.TIMEOUT, errors.Unavailable)])
def test_replication_errors_map_as_for_the_sync_submit(env: Env, reason: FailReason,
                                                        kind: type[errors.BrokerError]) -> None:
    error = ReplicationError(reason, "memory:0" if reason == FailReason.NOT_LEADER else "")

    def failing(command: bytes, callback: Callback, *, sync: bool = False) -> None:
        callback(None, error)  # on the submitting thread, as a replicator may

    env.replicator.submit = failing  # type: ignore[method-assign]
    sync = _refused(lambda: env.submitter.submit(_command()))
    asynchronous = _refused(lambda: env.run(env.submitter.submit_async(_command())))
    assert type(asynchronous) is type(sync) and isinstance(sync, kind)
    assert str(asynchronous) == str(sync) and status_for(asynchronous)[:2] == status_for(sync)[:2]


def test_a_follower_refuses_before_submitting(env: Env) -> None:
    env.memory.step_down("memory:0")
    sync = _refused(lambda: env.submitter.submit(_command()))
    asynchronous = _refused(lambda: env.run(env.submitter.submit_async(_command())))
    assert isinstance(sync, errors.NotLeader) and type(asynchronous) is type(sync) and str(asynchronous) == str(sync)
    assert env.replicator.held == []


def test_a_leader_not_ready_refuses_every_change_before_it_reads_its_state(env: Env) -> None:
    """Until the state holds every write committed before this leader's term, a missing topic may
    only be missing here: each change is UNAVAILABLE (retry), never NOT_FOUND, and nothing is submitted."""
    env.log.create_topic(internal_pb2.TopicConfig(name="t", partitions=1))
    env.replicator.ready = False
    retention = internal_pb2.Retention()
    one = [broker_pb2.PublishRecord(value=b"v")]
    changes: list[Callable[[], object]] = [
        lambda: env.log.publish(publish_request("gone", one)), lambda: env.log.publish(publish_request("t", one)),
        lambda: env.run(env.log.publish_placed_async(publish_request("gone", one))),
        lambda: env.log.drop_topic("gone"), lambda: env.log.alter_topic("gone", retention, 0),
        lambda: env.log.prune("gone", None, 1), lambda: env.log.clear_topic("gone"),
        lambda: env.log.reset_watermark("gone", "p"), lambda: env.log.create_topic(internal_pb2.TopicConfig(name="t")),
        lambda: env.submitter.submit(_command())]
    env.replicator.holding = True
    for change in changes:
        refused = _refused(change)
        assert type(refused) is errors.Unavailable, refused
        assert str(refused) == ("this node was just elected and is still applying the writes committed before its "
                                "term; nothing was written; retry shortly")
        assert status_for(refused)[0] == grpc.StatusCode.UNAVAILABLE
    assert env.replicator.held == []
    env.replicator.ready = True
    assert isinstance(_refused(lambda: env.log.drop_topic("gone")), errors.TopicNotFound)


async def _offload(fn: Callable[[], Any]) -> Any:
    """What ``StreamRuntime.call`` does, on the default executor."""
    return await asyncio.get_running_loop().run_in_executor(None, fn)


@pytest.mark.parametrize("offload", [None, _offload])
def test_the_async_publish_answers_and_refuses_as_the_sync_one(env: Env, offload: Any) -> None:
    for name, extra in (("t", {}), ("s", {"schema_json": '{"type": "object", "required": ["n"]}'}),
                        ("e", {"durability": internal_pb2.DURABILITY_EPHEMERAL}),
                        ("f", {"durability": internal_pb2.DURABILITY_FSYNC})):
        env.log.create_topic(internal_pb2.TopicConfig(name=name, partitions=3, **extra))
    assert env.log.checks_documents("s") and not env.log.checks_documents("t")
    assert not env.log.checks_documents("missing")

    def both(topic: str, *records: broker_pb2.PublishRecord, **fields: Any) -> tuple[Published, Published]:
        request = functools.partial(publish_request, topic=topic, records=records, **fields)
        sync = env.log.publish_placed(request(), "alice")
        return sync, env.run(env.log.publish_placed_async(request(), "alice", offload))

    R = broker_pb2.PublishRecord
    for topic in ("t", "e", "f"):
        sync, asynchronous = both(topic, R(value=b"a", partition=0), R(value=b"b", partition=2))
        assert asynchronous.partitions == sync.partitions == [0, 2]
        assert [(p, o) for p, o, _, _ in asynchronous.placements] == [(p, o + 1) for p, o, _, _ in sync.placements]
    synced_before = env.memory.synced_submits
    both("f", R(value=b"x"))
    assert env.memory.synced_submits == synced_before + 2  # fsync topics submit synced both ways
    sync, asynchronous = both("s", R(value=b'{"n": 1}'))
    assert len(asynchronous.placements) == len(sync.placements) == 1
    for topic, records, fields in (("s", [R(value=b"{}")], {}), ("missing", [R(value=b"a")], {}),
                                   ("t", [], {}), ("t", [R(value=b"x" * 2000)], {}),
                                   ("t", [R(value=b"a", msg_id=1)], {}),
                                   ("e", [R(value=b"a", msg_id=1)], {"dedup_id": "d"})):
        request = functools.partial(publish_request, topic=topic, records=records, **fields)
        def sync_call(r: Callable[[], PublishBatch] = request) -> object:
            return env.log.publish_placed(r())

        def async_call(r: Callable[[], PublishBatch] = request) -> object:
            return env.run(env.log.publish_placed_async(r(), "", offload))

        sync_error, async_error = _refused(sync_call), _refused(async_call)
        assert type(async_error) is type(sync_error) and str(async_error) == str(sync_error), topic
    assert env.loop_errors == []
