"""One committed command must never stop the log (issue 11, item 2): the apply wall in the state
machine, the three confirmed triggers applied directly, and the leader-side checks that now refuse
them before they are submitted (unit: state machine over MemoryStore)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.core import records
from broker.core.applied import CacheChanges, Rejected
from broker.core.errors import ApplyFailed, InvalidArgument
from broker.core.groups import layout
from broker.core.groups.apply import GroupApplier, SettleResult
from broker.core.groups.config import EXTEND_MAX_MS, NACK_DELAY_MAX_MS
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.storage import Batch, Column, StorageFailure
from broker.storage.memory import MemoryStore
from broker.v1 import internal_pb2
from tests.core.groups_env import make_env, positions

pytestmark = pytest.mark.unit
K = internal_pb2
INT64_MAX = 2**63 - 1


def dump(sm: BrokerStateMachine) -> list[tuple[bytes, bytes]]:
    return [kv for c in Column for kv in sm.store.scan(c, b"", b"\xff" * 40)]


def without_applied(rows: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in rows if k != b"applied"]


def topic_cmd(name: str, partitions: int = 1) -> bytes:
    return K.Command(create_topic=K.CreateTopicCommand(config=K.TopicConfig(name=name, partitions=partitions),
                                                       now_ms=1000)).SerializeToString()


def barrier(term: int) -> bytes:
    return K.Command(group_barrier=K.GroupBarrierCommand(term=term)).SerializeToString()


def exploding_machine() -> BrokerStateMachine:
    """A state machine whose ``group_barrier`` handler writes, then raises (a bug in a handler)."""
    sm = BrokerStateMachine(MemoryStore(), Changes())

    def handler(cmd: K.GroupBarrierCommand, batch: Batch, changes: CacheChanges) -> object:
        batch.put(Column.META, b"partial", b"written before the failure")
        sm.put_topic(K.TopicMeta(topic_id=99, config=internal_pb2.TopicConfig(name="ghost")), batch, changes)
        if cmd.term == 13:
            raise OverflowError("value out of range")
        return None

    sm.register("group_barrier", handler)
    return sm


def test_a_raising_handler_is_recorded_as_failed_and_the_index_moves_on() -> None:
    sm = exploding_machine()
    sm.apply(1, topic_cmd("t"))
    before = dump(sm)
    result = sm.apply(2, barrier(13))
    assert isinstance(result, Rejected) and isinstance(result.error, ApplyFailed)
    assert "group_barrier" in str(result.error) and "OverflowError" in str(result.error)
    assert sm.applied_index() == 2
    # nothing of the failed apply was written or published: only the index moved
    assert without_applied(dump(sm)) == without_applied(before)
    assert sm.topic("ghost") is None
    # the log goes on
    assert sm.apply(3, barrier(1)) is None and sm.applied_index() == 3
    assert sm.topic("ghost") is not None
    # replaying the failed index (a restart) changes nothing
    assert sm.apply(2, barrier(13)) is None
    assert sm.failed_applies == {"group_barrier": 1}, "counted once, by kind (raftbroker_apply_failures_total)"


def test_every_node_records_the_same_failure() -> None:
    commands = [topic_cmd("t"), barrier(13), topic_cmd("u"), barrier(13)]
    nodes = [exploding_machine(), exploding_machine()]
    results = [[str(getattr(n.apply(i, c), "error", "")) for i, c in enumerate(commands, start=1)] for n in nodes]
    assert results[0] == results[1]
    assert dump(nodes[0]) == dump(nodes[1])


def test_undecodable_and_unknown_commands_are_rejected_not_raised() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    result = sm.apply(1, b"\xff\xff\xff")
    assert isinstance(result, Rejected) and isinstance(result.error, ApplyFailed)
    assert "undecodable" in str(result.error)
    result = sm.apply(2, K.Command(create_group=K.CreateGroupCommand(topic="t", group="g")).SerializeToString())
    assert isinstance(result, Rejected) and "unknown command 'create_group'" in str(result.error)
    assert sm.applied_index() == 2
    assert sm.failed_applies == {"undecodable": 1, "create_group": 1}


class FailingStore(MemoryStore):
    """A store whose reads fail after ``fail`` is set (a dying disk)."""

    fail = False

    def get(self, column: Column, key: bytes) -> bytes | None:
        if self.fail:
            raise StorageFailure("read failed: I/O error")
        return super().get(column, key)

    def scan(self, column: Column, begin: bytes, end: bytes, limit: int | None = None) -> Iterator[
            tuple[bytes, bytes]]:
        if self.fail:
            raise StorageFailure("scan failed: I/O error")
        return super().scan(column, begin, end, limit)


def test_a_storage_failure_stops_the_apply_instead_of_skipping_the_command() -> None:
    store = FailingStore()
    sm = BrokerStateMachine(store, Changes())
    GroupApplier(sm)
    sm.apply(1, topic_cmd("t"))
    store.fail = True
    create = K.Command(create_group=K.CreateGroupCommand(topic="t", topic_id=1, group="g", now_ms=1,
                                                         start_offsets=[0])).SerializeToString()
    with pytest.raises(StorageFailure):
        sm.apply(2, create)
    assert sm.applied_index() == 1  # not recorded: the node must stop, not diverge


# -- the three triggers, applied as committed commands (as if a leader had submitted them) -----------

def group_machine(topic: str = "t") -> BrokerStateMachine:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    GroupApplier(sm)
    sm.apply(1, topic_cmd(topic))
    body = K.RecordBody(value=b"v").SerializeToString()
    sm.apply(2, K.Command(append=K.AppendCommand(topic=topic, topic_id=1, now_ms=2000, partitions=[0],
                                                 bodies=[body])).SerializeToString())
    return sm


def create_group(topic: str, group: str) -> bytes:
    from broker.core.groups.config import normalized_group_config
    config = normalized_group_config(internal_pb2.GroupConfig())
    return K.Command(create_group=K.CreateGroupCommand(topic=topic, topic_id=1, group=group, config=config,
                                                       now_ms=3000, start_offsets=[0])).SerializeToString()


@pytest.mark.parametrize(("topic", "group"), [("t", "g\n"), ("x" * 245, "g")])
def test_a_group_whose_dead_letter_name_is_invalid_is_rejected_at_apply(topic: str, group: str) -> None:
    sm = group_machine(topic)
    before = dump(sm)
    result = sm.apply(3, create_group(topic, group))
    assert isinstance(result, Rejected) and isinstance(result.error, InvalidArgument), result
    assert sm.applied_index() == 3 and without_applied(dump(sm)) == without_applied(before)


def test_a_nack_delay_that_overflows_int64_is_applied_with_a_capped_due_time() -> None:
    sm = group_machine()
    meta = sm.apply(3, create_group("t", "g"))
    assert isinstance(meta, K.GroupMeta)
    entry = K.SettleEntry(kind=K.SETTLE_NACK, partition=0, offset=0, delay_ms=INT64_MAX)
    cmd = K.Command(group_settle=K.GroupSettleCommand(topic="t", group="g", group_id=meta.group_id,
                                                      now_ms=10_000, entries=[entry]))
    result = sm.apply(4, cmd.SerializeToString())
    assert isinstance(result, SettleResult), result
    raw = sm.store.get(Column.GROUPS, layout.retry_key(meta.group_id, 0, 0))
    assert raw is not None and K.RetryState.FromString(raw).due_ms == INT64_MAX


# -- the leader refuses them before submitting: INVALID_ARGUMENT, nothing replicated ------------------

def test_the_leader_refuses_the_triggers_before_submitting() -> None:
    env = make_env()
    env.topic("t")
    env.topic("x" * 245)
    env.publish("t", [b"a"])
    rt = env.group("t", "g")
    applied = env.state.applied_index()
    for topic, group in (("t", "g\n"), ("t", "g\r\n"), ("x" * 245, "g"), ("t\n", "g"), ("t", "")):
        with pytest.raises(InvalidArgument):
            env.service.create(topic, group, internal_pb2.GroupConfig())
    forged = records.PositionToken(rt.meta.topic_id, 0, 1).encode()  # a record, but no lease is held
    for delay in (INT64_MAX, NACK_DELAY_MAX_MS + 1, -1):
        with pytest.raises(InvalidArgument, match="delay_ms"):
            env.service.nack("t", "g", [forged], delay, False)
    assert env.state.applied_index() == applied
    assert layout.get_meta(env.state.store, "t", "g\n") is None


def test_extend_checks_everything_before_changing_a_lease() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a"])
    rt = env.group("t", "g", visibility_timeout_ms=1000)
    tokens = positions(env.pick(rt, 1))
    deadline = rt.leases.get((0, 0)).deadline_ms  # type: ignore[union-attr]
    for bad in (EXTEND_MAX_MS + 1, INT64_MAX, -1):
        with pytest.raises(InvalidArgument, match="extend_ms"):
            env.service.extend("t", "g", tokens, bad)
    with pytest.raises(InvalidArgument):  # a valid token, then a malformed one: no lease changes either
        env.service.extend("t", "g", [*tokens, b"short"], 5000)
    assert rt.leases.get((0, 0)).deadline_ms == deadline  # type: ignore[union-attr]
    env.clock.advance(10)
    assert env.service.extend("t", "g", tokens, EXTEND_MAX_MS) == [env.clock.now_ms() + EXTEND_MAX_MS]


def test_a_refused_join_creates_no_group() -> None:
    env = make_env()
    env.topic("t")
    applied = env.state.applied_index()
    with pytest.raises(InvalidArgument, match="queue mode"):
        env.service.join("t", "q", "m1", internal_pb2.GroupConfig())
    assert layout.get_meta(env.state.store, "t", "q") is None and env.state.applied_index() == applied
    stream = internal_pb2.GroupConfig(mode=internal_pb2.DELIVERY_MODE_STREAM)
    member, partitions, _ = env.service.join("t", "s", "m1", stream)
    assert member == "m1" and partitions == [0]
