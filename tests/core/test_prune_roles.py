"""Lead and protect groups decide explicit prunes at apply (SPEC §2.2) (unit)."""

from __future__ import annotations

import pytest

from broker.core.errors import FailedPrecondition, GroupNotFound, InvalidArgument
from broker.v1 import internal_pb2
from tests.core.groups_env import Env, make_env

pytestmark = pytest.mark.unit
LEAD, PROTECT, NONE = internal_pb2.PRUNE_ROLE_LEAD, internal_pb2.PRUNE_ROLE_PROTECT, internal_pb2.PRUNE_ROLE_NONE


def setup(partitions: int = 2, records: int = 20) -> Env:
    env = make_env()
    env.topic("t", partitions)
    for p in range(partitions):
        env.publish("t", [b"%d" % i for i in range(records)], partition=p)
    env.group("t", "lead")
    env.group("t", "guard")
    return env


def seek(env: Env, group: str, offset: int, partition: int | None = None) -> None:
    env.ops.seek("t", group, internal_pb2.Position(offset=offset), partition)


def starts(env: Env) -> list[int]:
    return [p.start_offset for p in env.log.describe_topic("t").partitions]


def test_a_lead_group_prunes_up_to_its_committed_position_in_each_partition() -> None:
    env = setup()
    seek(env, "lead", 7, 0)
    seek(env, "lead", 3, 1)
    with pytest.raises(FailedPrecondition, match="not marked lead"):
        env.log.prune("t", None, 0, group="lead")
    assert env.ops.mark("t", "lead", LEAD).meta.prune_role == LEAD
    assert env.log.prune("t", None, 0, group="lead") == 10
    assert starts(env) == [7, 3]
    assert env.log.prune("t", None, 5, group="lead") == 0, "an offset bounds a lead prune further"
    assert env.log.prune("t", 1, 0, group="lead") == 0


def test_a_protecting_group_refuses_prunes_and_clears_past_its_position() -> None:
    env = setup()
    env.ops.mark("t", "lead", LEAD)
    env.ops.mark("t", "guard", PROTECT)
    seek(env, "lead", 15)
    seek(env, "guard", 4, 0)
    seek(env, "guard", 9, 1)
    with pytest.raises(FailedPrecondition, match="group 'guard' protects partition 0 from offset 4"):
        env.log.prune("t", None, 0, group="lead")
    with pytest.raises(FailedPrecondition, match="clear of topic 't' refused"):
        env.log.clear_topic("t")
    assert starts(env) == [0, 0], "nothing of a refused prune is deleted"
    assert env.log.prune("t", 1, 9) == 9, "up to the protected position is fine"
    env.ops.mark("t", "guard", NONE)
    assert env.log.prune("t", None, 0, group="lead") == 15 + 6
    assert starts(env) == [15, 15]


def test_a_protecting_group_behind_the_log_start_does_not_block_a_prune_that_deletes_nothing() -> None:
    env = setup(partitions=1)
    env.log.prune("t", None, 8)  # the guard (at 0) is not protecting yet: it is now behind the start
    env.ops.mark("t", "guard", PROTECT)
    assert env.log.prune("t", None, 8) == 0
    with pytest.raises(FailedPrecondition):
        env.log.prune("t", None, 9)


def test_marks_need_a_group_and_a_known_role_and_prunes_a_group() -> None:
    env = setup(partitions=1)
    with pytest.raises(GroupNotFound):
        env.ops.mark("t", "nobody", LEAD)
    with pytest.raises(InvalidArgument):
        env.ops.mark("t", "lead", 7)
    with pytest.raises(GroupNotFound):
        env.log.prune("t", None, 0, group="nobody")
    assert starts(env) == [0]


def test_a_group_of_an_earlier_incarnation_neither_leads_nor_protects() -> None:
    env = setup(partitions=1)
    env.ops.mark("t", "guard", PROTECT)
    env.ops.mark("t", "lead", LEAD)
    env.log.drop_topic("t")
    env.topic("t", 1)
    env.publish("t", [b"x"] * 5)
    assert env.log.prune("t", None, 3) == 3, "the guard follows the old incarnation until it rebases"
    with pytest.raises(FailedPrecondition, match="earlier incarnation"):
        env.log.prune("t", None, 0, group="lead")
