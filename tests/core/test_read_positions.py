"""A start position past a node's end of a partition (``Reader._past_the_end``): only a leader that
has applied everything committed before its term refuses it as INVALID_ARGUMENT; any other node may
just be behind (a client resuming after a failover brings a token another node issued), so it sends
the caller on (NotLeader, Unavailable), which the SDKs retry."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from broker.core.errors import InvalidArgument, NotLeader, Unavailable
from broker.core.records import PositionToken
from broker.leader.packed_reads import PackedBatch
from broker.leader.reading import Idle, Reader
from broker.services import wire
from broker.v1 import broker_pb2, common_pb2
from tests.core.groups_env import Env, make_env

pytestmark = pytest.mark.unit


@pytest.fixture
def env() -> Iterator[Env]:
    e = make_env()
    e.topic("t")
    e.publish("t", [b"r%d" % i for i in range(5)])
    yield e
    e.replicator.close()


def _raise(exc: Exception) -> Callable[[], None]:
    def check() -> None:
        raise exc
    return check


def _token(env: Env, offset: int) -> common_pb2.Position:
    meta = env.state.topic("t")
    assert meta is not None
    return common_pb2.Position(token=PositionToken(meta.topic_id, 0, offset).encode())


def _offsets(reader: Reader, position: common_pb2.Position) -> list[int]:
    request = broker_pb2.SubscribeRequest(topic="t", partition=0, stop_at_end=True, **{"from": position})
    got: list[int] = []
    for step in reader.subscribe_steps(wire.subscription(request), lambda: True):
        assert not isinstance(step, Idle | PackedBatch)
        got.extend(r.offset for r in step.batch.records)
    return got


@pytest.mark.parametrize("past", ["token", "offset"])
def test_a_position_past_the_end_is_refused_by_the_leader_and_sent_on_by_any_other_node(env: Env, past: str) -> None:
    def position(offset: int) -> common_pb2.Position:
        return _token(env, offset) if past == "token" else common_pb2.Position(offset=offset)

    leader = Reader(env.state, require_leader=lambda: None)
    with pytest.raises(InvalidArgument, match="past the end \\(5\\) of partition 0"):
        _offsets(leader, position(8))
    follower = Reader(env.state, require_leader=_raise(NotLeader("10.0.0.7:7000")))
    with pytest.raises(NotLeader) as sent:
        _offsets(follower, position(8))
    assert sent.value.leader_address == "10.0.0.7:7000"
    electing = Reader(env.state, require_leader=_raise(Unavailable("no leader is elected yet")))
    with pytest.raises(Unavailable):
        _offsets(electing, position(8))
    for reader in (leader, follower, electing):  # any node serves a position it holds, up to its end
        assert _offsets(reader, position(3)) == [3, 4]
        assert _offsets(reader, position(5)) == []
