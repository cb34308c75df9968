"""Group operations and loss events: seek/replay, lag by hand count, SKIP_FORWARD, RESET, BADMSG
(including a flipped byte in the store), and the group stream itself (unit)."""

from __future__ import annotations

import pytest

from broker.core import records
from broker.core.errors import GroupNotFound, InvalidArgument, TopicNotFound
from broker.leader.reading import Reader
from broker.services import wire
from broker.v1 import broker_pb2, common_pb2, internal_pb2
from tests.core.groups_env import Env, make_env, positions, values
from tests.record_store import flip_record_byte

pytestmark = pytest.mark.unit


def drain(env: Env, topic: str, group: str, ack: bool = True,
          **request: object) -> list[common_pb2.Record | internal_pb2.Event]:
    """Everything one group stream delivers until it has nothing more (acking as it goes)."""
    req = broker_pb2.SubscribeRequest(topic=topic, group=group, stop_at_end=True, **request)  # type: ignore[arg-type]
    out: list[common_pb2.Record | internal_pb2.Event] = []
    for item in env.delivery.subscribe(wire.subscription(req), lambda: True):
        if item.HasField("event"):
            out.append(item.event)
            continue
        out.extend(item.batch.records)
        if ack:
            env.service.ack(topic, group, [r.position for r in item.batch.records])
        else:
            env.service.nack(topic, group, [r.position for r in item.batch.records], 0, release=True)
            break
    return out


def test_seek_to_a_timestamp_replays_and_lag_matches_a_hand_count() -> None:
    env = make_env()
    env.topic("t", 2)
    env.publish("t", [b"old%d" % i for i in range(4)])
    env.clock.advance(10_000)
    cut = env.clock.now_ms()
    env.publish("t", [b"new%d" % i for i in range(6)])
    assert len(drain(env, "t", "g")) == 10
    lag = env.ops.lag("t", "g")
    assert [(p.end_offset, p.committed, p.lag) for p in lag.partitions] == [(5, 5, 0), (5, 5, 0)]
    moved = env.ops.seek("t", "g", internal_pb2.Position(timestamp_ms=cut), None)
    assert moved == [(0, 2), (1, 2)]
    replayed = drain(env, "t", "g", ack=False, max_in_flight=3)
    assert len(replayed) == 3
    lag = env.ops.lag("t", "g")
    by_hand = [sum(1 for r in replayed if r.partition == p) for p in (0, 1)]
    assert [p.lag for p in lag.partitions] == [3, 3]
    assert [p.in_flight for p in lag.partitions] == [0, 0], "released on the way out"
    assert sum(by_hand) == 3
    assert {v.value[:3] for v in replayed} == {b"new"}
    env.clock.advance(500)
    lag = env.ops.lag("t", "g")
    assert all(p.lag_ms == 500 for p in lag.partitions), "age of the oldest unsettled record"
    rest = drain(env, "t", "g")
    assert sorted(r.value for r in rest) == sorted(b"new%d" % i for i in range(6))
    env.ops.seek("t", "g", internal_pb2.Position(start=internal_pb2.START_POSITION_LATEST), None)
    assert drain(env, "t", "g") == []


def test_skip_forward_when_records_were_pruned_below_the_watermark() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"%d" % i for i in range(6)])
    env.group("t", "g")
    env.log.prune("t", 0, 4)
    first = drain(env, "t", "g", ack=False)
    again = drain(env, "t", "g")
    for items in (first, again):
        event = items[0]
        assert isinstance(event, internal_pb2.Event) and event.type == common_pb2.EVENT_TYPE_SKIP_FORWARD
        assert (event.offset_before, event.offset_after) == (0, 4)
        assert records.PositionToken.decode(event.position_after).next_offset == 4
    assert [r.value for r in again[1:]] == [b"4", b"5"]
    assert drain(env, "t", "g") == [], "reported until the group settled records after the gap"
    assert env.ops.lag("t", "g").partitions[0].committed == 6


def test_reset_after_drop_and_recreate_then_the_new_records() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"a", b"b", b"c"])
    assert len(drain(env, "t", "g")) == 3
    old = env.state.topic("t")
    assert old is not None
    env.log.drop_topic("t")
    with pytest.raises(Exception, match="does not exist"):
        drain(env, "t", "g")
    env.topic("t")
    env.publish("t", [b"x", b"y"])
    items = drain(env, "t", "g", ack=False)
    event = items[0]
    assert isinstance(event, internal_pb2.Event) and event.type == common_pb2.EVENT_TYPE_RESET
    before, after = (records.PositionToken.decode(event.position_before),
                     records.PositionToken.decode(event.position_after))
    assert (before.incarnation, before.next_offset) == (old.topic_id, 3)
    assert after.incarnation != old.topic_id and after.next_offset == 0
    replay = drain(env, "t", "g")
    assert replay[0] == event, "re-subscribing from the same position reports the same event"
    assert [r.value for r in replay[1:]] == [b"x", b"y"]
    assert drain(env, "t", "g") == []


def test_badmsg_for_a_flipped_byte_in_the_store_stateless_and_group() -> None:
    env = make_env()
    env.topic("t")
    env.publish("t", [b"good0", b"evil", b"good2"])
    tid = env.state.topic("t").topic_id  # type: ignore[union-attr]
    flip_record_byte(env.state.store, tid, 0, 1)  # the middle record of the stored batch
    request = wire.subscription(broker_pb2.SubscribeRequest(topic="t", stop_at_end=True))
    stateless = list(Reader(env.state).subscribe(request, lambda: True))
    kinds = [("event", i.event.type, i.event.offset_before, i.event.offset_after) if i.HasField("event")
             else ("batch", [r.value for r in i.batch.records]) for i in stateless]
    assert kinds == [("batch", [b"good0"]), ("event", common_pb2.EVENT_TYPE_BADMSG, 1, 2), ("batch", [b"good2"])]
    items = drain(env, "t", "g")
    bad = [i for i in items if isinstance(i, internal_pb2.Event)]
    assert [(e.type, e.offset_before, e.offset_after) for e in bad] == [(common_pb2.EVENT_TYPE_BADMSG, 1, 2)]
    assert sorted(r.value for r in items if not isinstance(r, internal_pb2.Event)) == [b"good0", b"good2"]
    [dead] = env.ops.dead_letters("t", "g", 0, None, None)
    assert dead.offset == 1 and dead.reason.startswith("badmsg")
    assert env.ops.dead_letters("t", "g", 0, 0, None) == [dead]
    for partition in (1, 2**32 - 1):  # the last one used to fail the key's 32-bit packing (INTERNAL)
        with pytest.raises(InvalidArgument, match=f"partition {partition} does not exist"):
            env.ops.dead_letters("t", "g", 0, partition, None)
    assert env.ops.lag("t", "g").partitions[0].committed == 3


def test_delete_ends_the_group_and_describe_reports_members() -> None:
    env = make_env()
    env.topic("t", 2)
    env.group("t", "s", mode=internal_pb2.DELIVERY_MODE_STREAM)
    env.service.join("t", "s", "alice", internal_pb2.GroupConfig())
    info = wire.group_info(env.ops.describe("t", "s"))
    assert info.dlq_topic == "t.s.dlq" and [m.member_id for m in info.members] == ["alice"]
    assert list(info.members[0].partitions) == [0, 1]
    assert [g.meta.group for g in env.ops.list_groups("t")] == ["s"]
    with pytest.raises(TopicNotFound):  # not an empty list: the topic itself is missing
        env.ops.list_groups("nope")
    with pytest.raises(InvalidArgument):
        env.ops.list_groups("bad name!")
    env.ops.delete("t", "s")
    with pytest.raises(GroupNotFound):
        env.ops.describe("t", "s")
    assert env.state.topic("t.s.dlq") is not None, "the dead-letter topic stays"


def test_group_subscription_validates_before_streaming() -> None:
    env = make_env()
    env.topic("t")
    with pytest.raises(Exception, match="member_id"):
        stream = broker_pb2.SubscribeRequest(
            topic="t", group="s", group_config=common_pb2.GroupConfig(mode=common_pb2.DELIVERY_MODE_STREAM))
        env.delivery.subscribe(wire.subscription(stream), lambda: True)
    with pytest.raises(Exception, match="partition"):
        one = broker_pb2.SubscribeRequest(topic="t", group="g", partition=0)
        env.delivery.subscribe(wire.subscription(one), lambda: True)
    env.publish("t", [b"1", b"2"])
    latest = common_pb2.Position(start=common_pb2.START_POSITION_LATEST)
    assert drain(env, "t", "late", **{"from": latest}) == [], "start_from applies when the group is created"
    env.publish("t", [b"3"])
    assert values_of(drain(env, "t", "late")) == [b"3"]
    rt = env.service.runtime("t", "late")
    assert not positions(env.pick(rt, rt.open_stream())) and not values(env.pick(rt, rt.open_stream()))


def values_of(items: list[common_pb2.Record | internal_pb2.Event]) -> list[bytes]:
    return [r.value for r in items if not isinstance(r, internal_pb2.Event)]
