"""Group commands inside the state machine: determinism, retries with backoff, dead letters, seek,
pause, delete, rebase (unit: state machine over MemoryStore)."""

from __future__ import annotations

import pytest

from broker.core.applied import Rejected
from broker.core.errors import GroupExists, GroupNotFound
from broker.core.groups import layout
from broker.core.groups.apply import DeadRetried, GroupApplier, Outcome, SettleResult
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.storage import Column
from broker.storage.memory import MemoryStore
from broker.v1 import internal_pb2
from tests.core.groups_env import make_env

pytestmark = pytest.mark.unit
K = internal_pb2


def machine() -> tuple[BrokerStateMachine, list[bytes]]:
    """A state machine with topic ``t`` (2 partitions, 4 records each) and the commands so far."""
    sm = BrokerStateMachine(MemoryStore(), Changes())
    GroupApplier(sm)
    cmds = [K.Command(create_topic=K.CreateTopicCommand(config=internal_pb2.TopicConfig(name="t", partitions=2),
                                                        now_ms=1000)).SerializeToString()]
    bodies = [K.RecordBody(value=b"v%d" % i, key=b"k%d" % (i % 2)).SerializeToString() for i in range(8)]
    cmds.append(K.Command(append=K.AppendCommand(topic="t", topic_id=1, now_ms=2000, partitions=[0, 1] * 4,
                                                 bodies=bodies)).SerializeToString())
    for i, c in enumerate(cmds, start=1):
        sm.apply(i, c)
    return sm, bodies


def create(config: internal_pb2.GroupConfig | None = None, starts: tuple[int, int] = (0, 0)) -> bytes:
    cfg = config or internal_pb2.GroupConfig(mode=internal_pb2.DELIVERY_MODE_QUEUE, max_attempts=3, base_delay_ms=100,
                                           max_delay_ms=1000, backoff=internal_pb2.BACKOFF_EXPONENTIAL)
    return K.Command(create_group=K.CreateGroupCommand(topic="t", topic_id=1, group="g", config=cfg, now_ms=3000,
                                                       start_offsets=starts)).SerializeToString()


def settle(gid: int, now_ms: int, *entries: K.SettleEntry, commits: tuple[tuple[int, int], ...] = ()) -> bytes:
    return K.Command(group_settle=K.GroupSettleCommand(
        topic="t", group="g", group_id=gid, now_ms=now_ms, entries=entries, commit_partitions=[p for p, _ in commits],
        commit_offsets=[o for _, o in commits])).SerializeToString()


def nack(p: int, o: int, body: bytes, kind: int = K.SETTLE_NACK) -> K.SettleEntry:
    return K.SettleEntry(kind=kind, partition=p, offset=o, body=body, timestamp_ms=2000)  # type: ignore[arg-type]


def ack(p: int, o: int) -> K.SettleEntry:
    return K.SettleEntry(kind=K.SETTLE_ACK, partition=p, offset=o)


def dump(sm: BrokerStateMachine) -> list[tuple[bytes, bytes]]:
    return [kv for c in (Column.META, Column.RECORDS, Column.GROUPS) for kv in sm.store.scan(c, b"", b"\xff" * 20)]


def test_create_makes_the_dead_letter_topic_and_cursors() -> None:
    sm, _ = machine()
    meta = sm.apply(3, create(starts=(1, 2)))
    assert isinstance(meta, K.GroupMeta) and meta.dlq_topic == "t.g.dlq"
    dlq = sm.topic("t.g.dlq")
    assert dlq is not None and dlq.config.partitions == 2
    assert [layout.get_cursor(sm.store, meta.group_id, p).committed for p in (0, 1)] == [1, 2]
    again = sm.apply(4, create())
    assert isinstance(again, Rejected) and isinstance(again.error, GroupExists)


def test_retries_back_off_then_dead_letter_with_headers() -> None:
    sm, bodies = machine()
    gid = sm.apply(3, create()).group_id  # type: ignore[attr-defined]
    r1 = sm.apply(4, settle(gid, 10_000, nack(0, 1, bodies[2])))
    assert isinstance(r1, SettleResult) and r1.outcomes == [Outcome.RETRY]
    retry = dict(((p, o), r) for p, o, r in layout.retries(sm.store, gid))[(0, 1)]
    assert (retry.attempts, retry.due_ms, retry.key) == (1, 10_100, b"k0")
    sm.apply(5, settle(gid, 20_000, nack(0, 1, bodies[2], K.SETTLE_EXPIRE)))
    retry = next(r for _, _, r in layout.retries(sm.store, gid))
    assert (retry.attempts, retry.due_ms) == (2, 20_200), "exponential: base * 2"
    r3 = sm.apply(6, settle(gid, 30_000, nack(0, 1, bodies[2])))
    assert isinstance(r3, SettleResult) and r3.outcomes == [Outcome.DEAD]
    cursor = layout.get_cursor(sm.store, gid, 0)
    assert cursor.is_settled(1) and cursor.retrying == 0 and cursor.dead == 1
    [(p, o, dead)] = list(layout.dead_letters(sm.store, gid))
    assert (p, o, dead.attempts, dead.dlq_partition, dead.dlq_offset) == (0, 1, 3, 0, 0)
    dlq = sm.topic("t.g.dlq")
    assert dlq is not None and sm.partition(dlq.topic_id, 0).end_offset == 1
    from broker.core import record_log
    stored = record_log.get(sm.store, dlq.topic_id, 0, 0, 0)
    assert stored is not None and stored.error is None
    copy = K.RecordBody.FromString(stored.body)
    assert copy.value == b"v2" and copy.key == b"k0"
    assert copy.headers["dlq.topic"] == "t" and copy.headers["dlq.offset"] == "1"
    assert copy.headers["dlq.attempts"] == "3" and "attempt 3 of 3" in copy.headers["dlq.reason"]


def test_ack_is_idempotent_and_acks_arrive_in_any_order() -> None:
    sm, _ = machine()
    gid = sm.apply(3, create()).group_id  # type: ignore[attr-defined]
    r = sm.apply(4, settle(gid, 1, ack(0, 2), ack(0, 0), ack(0, 2)))
    assert isinstance(r, SettleResult) and r.outcomes == [Outcome.SETTLED, Outcome.SETTLED, Outcome.IGNORED]
    cursor = layout.get_cursor(sm.store, gid, 0)
    assert cursor.committed == 1 and cursor.ranges == [(2, 3)]
    sm.apply(5, settle(gid, 1, ack(0, 1)))
    assert layout.get_cursor(sm.store, gid, 0).committed == 3


def test_commit_settles_below_and_never_regresses_and_clears_retries() -> None:
    sm, bodies = machine()
    gid = sm.apply(3, create()).group_id  # type: ignore[attr-defined]
    sm.apply(4, settle(gid, 1, nack(1, 1, bodies[3])))
    sm.apply(5, settle(gid, 1, commits=((1, 3),)))
    cursor = layout.get_cursor(sm.store, gid, 1)
    assert cursor.committed == 3 and cursor.retrying == 0 and not list(layout.retries(sm.store, gid))
    sm.apply(6, settle(gid, 1, commits=((1, 1),)))
    assert layout.get_cursor(sm.store, gid, 1).committed == 3
    sm.apply(7, settle(gid, 1, commits=((1, 99),)))
    assert layout.get_cursor(sm.store, gid, 1).committed == 4, "bounded by the partition's end"


def test_discard_retry_and_purge_dead_letters() -> None:
    sm, bodies = machine()
    gid = sm.apply(3, create()).group_id  # type: ignore[attr-defined]
    sm.apply(4, settle(gid, 5, nack(0, 0, bodies[0], K.SETTLE_DISCARD), nack(1, 2, bodies[5], K.SETTLE_DISCARD)))
    assert len(list(layout.dead_letters(sm.store, gid))) == 2
    retried = sm.apply(5, K.Command(retry_dead_letters=K.RetryDeadLettersCommand(
        topic="t", group="g", group_id=gid, now_ms=9, partitions=[0], offsets=[0])).SerializeToString())
    assert retried == DeadRetried(1, 0)
    [(p, o, r)] = list(layout.retries(sm.store, gid))
    assert (p, o, r.attempts, r.due_ms) == (0, 0, 0, 9)
    assert layout.get_cursor(sm.store, gid, 0).dead == 0 and layout.get_cursor(sm.store, gid, 0).retrying == 1
    r2 = sm.apply(6, settle(gid, 10, ack(0, 0)))
    assert isinstance(r2, SettleResult) and r2.outcomes == [Outcome.SETTLED], "a retried dead letter is pending again"
    purged = sm.apply(7, K.Command(purge_dead_letters=K.PurgeDeadLettersCommand(
        topic="t", group="g", group_id=gid)).SerializeToString())
    assert purged == 1 and not list(layout.dead_letters(sm.store, gid))


def test_seek_pause_delete_and_stale_group_ids() -> None:
    sm, bodies = machine()
    gid = sm.apply(3, create()).group_id  # type: ignore[attr-defined]
    sm.apply(4, settle(gid, 1, ack(0, 0), ack(0, 1), nack(0, 3, bodies[6])))
    moved = sm.apply(5, K.Command(seek_group=K.SeekGroupCommand(topic="t", group="g", group_id=gid, partitions=[0],
                                                                offsets=[0])).SerializeToString())
    assert moved == {0: 0}
    cursor = layout.get_cursor(sm.store, gid, 0)
    assert cursor.committed == 0 and cursor.retrying == 0 and not list(layout.retries(sm.store, gid))
    changed = sm.apply(6, K.Command(pause_groups=K.PauseGroupsCommand(topic="t", paused=True)).SerializeToString())
    assert changed == ["g"]
    meta = layout.get_meta(sm.store, "t", "g")
    assert meta is not None and meta.paused
    stale = sm.apply(7, settle(gid + 1, 1, ack(0, 0)))
    assert isinstance(stale, Rejected) and isinstance(stale.error, GroupNotFound)
    sm.apply(8, K.Command(delete_group=K.DeleteGroupCommand(topic="t", group="g", group_id=gid)).SerializeToString())
    assert layout.get_meta(sm.store, "t", "g") is None
    assert not list(sm.store.scan(Column.GROUPS, *layout.group_range(gid)))


def test_rebase_follows_a_recreated_topic_under_a_new_group_id() -> None:
    sm, _ = machine()
    gid = sm.apply(3, create()).group_id  # type: ignore[attr-defined]
    sm.apply(4, settle(gid, 1, ack(0, 0), ack(0, 1)))
    sm.apply(5, K.Command(drop_topic=K.DropTopicCommand(name="t", topic_id=1)).SerializeToString())
    created = sm.apply(6, K.Command(create_topic=K.CreateTopicCommand(
        config=internal_pb2.TopicConfig(name="t", partitions=1), now_ms=9)).SerializeToString())
    assert isinstance(created, K.TopicMeta)
    new = sm.apply(7, K.Command(rebase_group=K.RebaseGroupCommand(
        topic="t", group="g", group_id=gid, topic_id=created.topic_id, start_offsets=[0])).SerializeToString())
    assert isinstance(new, K.GroupMeta) and new.group_id != gid and new.partitions == 1
    assert new.reset_from_topic_id == 1 and list(new.reset_from_offsets) == [2, 0]
    assert not list(sm.store.scan(Column.GROUPS, *layout.group_range(gid)))


def test_every_node_ends_in_the_same_state() -> None:
    logs = []
    for _ in range(2):
        sm, bodies = machine()
        cmds = [create(), settle(1, 10, ack(0, 0), nack(0, 1, bodies[2]), nack(1, 0, bodies[1], K.SETTLE_DISCARD)),
                settle(1, 20, nack(0, 1, bodies[2]), nack(0, 1, bodies[2]), ack(1, 1), commits=((1, 2),)),
                K.Command(retry_dead_letters=K.RetryDeadLettersCommand(topic="t", group="g", group_id=1, now_ms=30,
                                                                       all=True)).SerializeToString()]
        for i, c in enumerate(cmds, start=3):
            sm.apply(i, c)
        logs.append(dump(sm))
    assert logs[0] == logs[1]


def test_service_rejects_bad_names_and_ephemeral_topics() -> None:
    env = make_env()
    env.log.create_topic(internal_pb2.TopicConfig(name="eph", durability=internal_pb2.DURABILITY_EPHEMERAL))
    with pytest.raises(Exception, match="ephemeral"):
        env.group("eph", "g")
    env.topic("x" * 240)
    with pytest.raises(Exception, match="too long"):
        env.group("x" * 240, "group-name")
    with pytest.raises(Exception, match="invalid group name"):
        env.group("eph", "a.b")
