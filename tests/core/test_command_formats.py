"""Command formats (broker/core/formats.py, docs/design/command-formats.md): a node halts before a
committed command of a newer format than its code applies, writing and recording nothing, and after
an upgrade applies it from there."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.core import formats
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.formats import FormatRaiser
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.replication.memory import InMemoryReplicator
from broker.storage import ApplyHalt, Column
from broker.storage.memory import MemoryStore
from broker.storage.rocks import RocksStore
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


# -- the cluster's format (set_format) ---------------------------------------------------------

def set_format(value: int, stated: int | None = None) -> bytes:
    cmd = formats.set_format_command(value)
    if stated is not None:
        cmd.format = stated
    return cmd.SerializeToString()


def test_set_format_raises_the_cluster_format_once_and_never_lowers_it() -> None:
    sm = BrokerStateMachine(MemoryStore(), Changes())
    assert sm.cluster_format == 0
    assert sm.apply(1, set_format(1)) is None and sm.cluster_format == 1
    assert sm.apply(2, set_format(1)) is None and sm.cluster_format == 1, "idempotent"
    assert sm.apply(3, set_format(0)) is None and sm.cluster_format == 1, "never lowered"
    assert sm.apply(1, set_format(0)) is None and sm.applied_index() == 3, "a replayed index changes nothing"
    assert formats.stored_cluster_format(sm.store) == 1
    assert BrokerStateMachine(sm.store, Changes()).cluster_format == 1, "kept in the store, read at start"
    assert not sm.failed_applies


def test_a_set_format_that_does_not_state_its_own_format_is_rejected_on_every_node() -> None:
    """Otherwise a node whose code applies the lower stated format would raise the cluster past it."""
    sm = BrokerStateMachine(MemoryStore(), Changes())
    result = sm.apply(1, set_format(1, stated=0))
    assert "must itself state format 1" in str(getattr(result, "error", ""))
    assert sm.cluster_format == 0 and sm.applied_index() == 1


def test_a_node_whose_code_applies_less_halts_before_set_format(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats, "APPLY_FORMAT", 0)  # an older release
    sm = BrokerStateMachine(MemoryStore(), Changes())
    with pytest.raises(formats.FormatTooNew, match="needs command format 1"):
        sm.apply(1, set_format(1))
    assert sm.cluster_format == 0 and sm.applied_index() == 0


def test_the_cluster_format_travels_in_snapshots_and_an_older_node_halts_on_restoring_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stores = [RocksStore(tmp_path / name) for name in "abc"]
    try:
        snapshot_and_restore(tmp_path, stores, monkeypatch)
    finally:
        for store in stores:
            store.close()


def snapshot_and_restore(tmp_path: Path, stores: list[RocksStore], monkeypatch: pytest.MonkeyPatch) -> None:
    source = BrokerStateMachine(stores[0], Changes())
    source.apply(1, create("a"))
    source.apply(2, set_format(1))
    source.write_snapshot(str(tmp_path / "snap"))
    shutil.copytree(tmp_path / "snap", tmp_path / "snap2")
    target = BrokerStateMachine(stores[1], Changes())
    target.restore_snapshot(str(tmp_path / "snap"), 2)
    assert target.cluster_format == 1 and target.topic("a") is not None
    monkeypatch.setattr(formats, "APPLY_FORMAT", 0)
    older = BrokerStateMachine(stores[2], Changes())
    with pytest.raises(formats.DataFormatTooNew, match="cluster command format 1.*applies formats up to 0") as raised:
        older.restore_snapshot(str(tmp_path / "snap2"), 2)
    assert isinstance(raised.value, ApplyHalt), "the replicator halts on it"
    with pytest.raises(formats.DataFormatTooNew, match="downgrade"):
        formats.check_data(BrokerStateMachine(target.store, Changes()).cluster_format)


@pytest.mark.parametrize(("raw", "expected"), [(None, formats.CODE_FORMAT), ("", formats.CODE_FORMAT), ("0", 0),
                                               (str(formats.CODE_FORMAT), formats.CODE_FORMAT)])
def test_the_test_only_apply_format_setting_may_only_lower_it(
        raw: str | None, expected: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if raw is None:
        monkeypatch.delenv(formats.APPLY_FORMAT_ENV, raising=False)
    else:
        monkeypatch.setenv(formats.APPLY_FORMAT_ENV, raw)
    assert formats._apply_format_from_env() == expected


@pytest.mark.parametrize("raw", [str(formats.CODE_FORMAT + 1), "-1", "one"])
def test_a_test_apply_format_above_the_code_or_malformed_is_refused(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(formats.APPLY_FORMAT_ENV, raw)
    with pytest.raises(ValueError, match=formats.APPLY_FORMAT_ENV):
        formats._apply_format_from_env()


# -- the leader's raiser -----------------------------------------------------------------------

class Members:
    """The members and what each answers (None: it does not)."""

    def __init__(self, **answers: int | None) -> None:
        self.answers = answers

    def peers(self) -> list[Peer]:
        return [Peer(node_id, f"raft:{node_id}", f"grpc:{node_id}") for node_id in self.answers]

    def formats_of(self, peers: list[Peer]) -> list[int | None]:
        return [self.answers[p.node_id] for p in peers]


@pytest.fixture
def leader() -> Iterator[tuple[BrokerStateMachine, CommandSubmitter]]:
    state = BrokerStateMachine(MemoryStore(), Changes())
    replicator = InMemoryReplicator(state)
    replicator.start()
    yield state, CommandSubmitter(replicator, PeerDirectory([]), 5.0)
    replicator.close()


def raiser(leader: tuple[BrokerStateMachine, CommandSubmitter], members: Members, hold: bool = False) -> FormatRaiser:
    state, submitter = leader
    return FormatRaiser(lambda: state.cluster_format, members.peers, members.formats_of, submitter,
                        self_id="n1", hold=hold)


def test_the_leader_raises_the_format_only_when_every_member_applies_it(
        leader: tuple[BrokerStateMachine, CommandSubmitter]) -> None:
    state, _ = leader
    members = Members(n1=None, n2=formats.CODE_FORMAT, n3=0)  # n1 is this node: never asked
    r = raiser(leader, members)
    assert r.members_formats() == {"n1": formats.APPLY_FORMAT, "n2": formats.CODE_FORMAT, "n3": 0}
    r.raise_if_ready()
    assert state.cluster_format == 0, "n3 applies only format 0"
    members.answers["n3"] = None
    r.raise_if_ready()
    assert state.cluster_format == 0, "a member that does not answer holds it"
    members.answers["n3"] = formats.CODE_FORMAT
    applied = state.applied_index()
    raiser(leader, members, hold=True).raise_if_ready()
    assert state.cluster_format == 0 and state.applied_index() == applied, "held: nothing submitted"
    r.raise_if_ready()
    assert state.cluster_format == formats.CODE_FORMAT
    applied = state.applied_index()
    r.raise_if_ready()
    assert state.applied_index() == applied, "nothing to raise: nothing submitted"
