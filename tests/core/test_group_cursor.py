"""Cursor math of consumer groups: a committed low-watermark plus acked ranges above it."""

from __future__ import annotations

import random

import pytest

from broker.core.groups.config import normalized_group_config, retry_delay_ms
from broker.core.groups.cursor import GroupCursor
from broker.v1 import internal_pb2

pytestmark = pytest.mark.unit


def test_out_of_order_acks_advance_the_watermark_only_over_contiguous_offsets() -> None:
    c = GroupCursor(0)
    assert c.ack(2) and c.ack(3) and c.ack(5)
    assert c.committed == 0 and c.ranges == [(2, 4), (5, 6)]
    assert c.ack(0)
    assert c.committed == 1
    assert c.ack(1)
    assert c.committed == 4 and c.ranges == [(5, 6)]
    assert not c.ack(2), "an offset below the watermark is settled already"
    assert c.ack(4)
    assert c.committed == 6 and c.ranges == []
    c.check()


def test_queries_match_a_set_model_under_random_acks() -> None:
    rng = random.Random(7)
    for _ in range(50):
        c = GroupCursor(10)
        acked: set[int] = set()
        for _ in range(60):
            o = rng.randrange(10, 60)
            expected = o not in acked
            assert c.ack(o) == expected
            acked.add(o)
            c.check()
            watermark = 10
            while watermark in acked:
                watermark += 1
            assert c.committed == watermark
            for probe in range(0, 70):
                assert c.is_settled(probe) == (probe < 10 or probe in acked)
            assert c.unsettled(60) == sum(1 for o in range(10, 60) if o not in acked)
            first = next(o for o in range(10, 80) if o not in acked)
            assert c.next_unsettled(0) == first


def test_commit_never_regresses_and_seek_may() -> None:
    c = GroupCursor(5)
    c.ack(8)
    assert not c.commit_to(3)
    assert c.committed == 5
    assert c.commit_to(7)
    assert c.committed == 7 and c.ranges == [(8, 9)]
    assert c.commit_to(8)
    assert c.committed == 9 and c.ranges == []
    c.seek(2)
    assert c.committed == 2 and not c.is_settled(5)


def test_encoding_round_trips_with_counts() -> None:
    c = GroupCursor(3, [(5, 7), (9, 10)], retrying=2, dead=1)
    assert GroupCursor.decode(c.encode()) == c


def test_backoff_fixed_and_exponential_with_cap() -> None:
    exp = normalized_group_config(internal_pb2.GroupConfig(base_delay_ms=100, max_delay_ms=500))
    assert [retry_delay_ms(exp, a) for a in (1, 2, 3, 4, 5)] == [100, 200, 400, 500, 500]
    fixed = normalized_group_config(internal_pb2.GroupConfig(backoff=internal_pb2.BACKOFF_FIXED, base_delay_ms=250))
    assert [retry_delay_ms(fixed, a) for a in (1, 2, 9)] == [250, 250, 250]


def test_config_defaults_and_limits() -> None:
    config = normalized_group_config(internal_pb2.GroupConfig())
    assert config.mode == internal_pb2.DELIVERY_MODE_QUEUE
    assert config.visibility_timeout_ms == 30_000 and config.max_attempts == 5
    assert config.start_from.start == internal_pb2.START_POSITION_EARLIEST
    with pytest.raises(Exception, match="max_delay_ms"):
        normalized_group_config(internal_pb2.GroupConfig(base_delay_ms=1000, max_delay_ms=10))
    with pytest.raises(Exception, match="ordered"):
        normalized_group_config(internal_pb2.GroupConfig(mode=internal_pb2.DELIVERY_MODE_STREAM, ordered=True))
