"""Command formats (broker/core/formats.py, docs/design/command-formats.md): a node halts before a
committed command of a newer format than its code applies, writing and recording nothing, and after
an upgrade applies it from there."""

from __future__ import annotations

import pytest

from broker.core import formats
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.storage import ApplyHalt, Column
from broker.storage.memory import MemoryStore
from broker.v1 import internal_pb2

pytestmark = pytest.mark.unit
K = internal_pb2


def create(name: str, fmt: int = 0) -> bytes:
    config = K.TopicConfig(name=name, partitions=1, durability=K.DURABILITY_DISK)
    return K.Command(create_topic=K.CreateTopicCommand(config=config, now_ms=1), format=fmt).SerializeToString()


def dump(sm: BrokerStateMachine) -> list[tuple[bytes, bytes]]:
    return [kv for column in Column for kv in sm.store.scan(column, b"", b"\xff" * 16)]


def test_commands_of_the_formats_this_code_applies_apply() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("a"))
    sm.apply(2, create("b", formats.APPLY_FORMAT))
    assert sm.topic("a") is not None and sm.topic("b") is not None and sm.applied_index() == 2


def test_a_newer_format_halts_before_the_command_and_an_upgraded_node_applies_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    sm.apply(1, create("a"))
    before = dump(sm)
    newer = formats.APPLY_FORMAT + 1
    with pytest.raises(formats.FormatTooNew, match=f"index 2 needs command format {newer}.*upgrade it") as raised:
        sm.apply(2, create("b", newer))
    assert isinstance(raised.value, ApplyHalt), "the replicator halts on it, as on a storage failure"
    assert dump(sm) == before and sm.applied_index() == 1 and sm.topic("b") is None
    assert not sm.failed_applies, "not recorded as a failure: a node that applies it would differ"
    monkeypatch.setattr(formats, "APPLY_FORMAT", newer)  # the same node, upgraded
    sm.apply(2, create("b", newer))
    assert sm.topic("b") is not None and sm.applied_index() == 2


def test_an_undecodable_command_still_meets_the_apply_wall_not_the_format_check() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    assert "undecodable" in str(getattr(sm.apply(1, b"\xff\xff\xff"), "error", ""))
    assert sm.applied_index() == 1
