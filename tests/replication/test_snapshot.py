"""SnapshotCodec: the dump pysyncobj stores at compaction (a kept checkpoint named by a small tar) and the
full snapshot it streams to followers."""

from __future__ import annotations

import io
import shutil
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.replication import FailReason, Role, snapshot
from broker.replication.raft import DUMP_FILE_NAME, PysyncobjReplicator
from broker.replication.snapshot import (
    PackState,
    SerializingInBackground,
    SnapshotCodec,
    SnapshotError,
    pack,
    read_raft_data,
    snapshot_index,
)

from .chain_sm import ChainStateMachine, damage_kept_checkpoint, read_records
from .cluster import wait_until
from .conftest import FAST_OPTIONS, Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

RAFT_DATA = ((b"\x00cmd", 7, 2), (b"\x01", 6, 2), {"127.0.0.1:1", "127.0.0.1:2"})


def at(index: int) -> tuple[object, ...]:
    """raftData of a snapshot at ``index``."""
    return ((b"", index, 2), (b"", index - 1, 2), set())


def sync_codec(sm: ChainStateMachine, work_dir: Path) -> SnapshotCodec:
    return SnapshotCodec(sm, work_dir, work_dir.parent / "dump", background=False)


def filled(directory: Path, commands: int) -> ChainStateMachine:
    sm = ChainStateMachine(directory)
    for index in range(1, commands + 1):
        sm.apply(index, b"command %d" % index)
    return sm


def test_round_trip_restores_state_and_returns_raft_data(tmp_path: Path) -> None:
    source = filled(tmp_path / "a", 5)
    sync_codec(source, tmp_path / "work-a").write(str(tmp_path / "dump"), RAFT_DATA)
    target = ChainStateMachine(tmp_path / "b")
    raft_data = sync_codec(target, tmp_path / "work-b").read(str(tmp_path / "dump"))
    assert raft_data == RAFT_DATA
    assert target.applied_index() == 7  # the snapshot's raft index, past the last command (5)
    assert target.chain() == source.chain()
    assert [r.kind for r in read_records(target.log_path)] == ["A"] * 5 + ["R"]
    assert not list((tmp_path / "work-b").iterdir()), "temporary directories are removed"


def test_state_machine_at_or_past_the_index_keeps_its_state(tmp_path: Path) -> None:
    sync_codec(filled(tmp_path / "a", 5), tmp_path / "work-a").write(str(tmp_path / "dump"), RAFT_DATA)
    ahead = filled(tmp_path / "b", 9)
    chain = ahead.chain()
    assert sync_codec(ahead, tmp_path / "work-b").read(str(tmp_path / "dump")) == RAFT_DATA
    assert ahead.applied_index() == 9 and ahead.chain() == chain


def sent(codec: SnapshotCodec, dump: Path, target: Path) -> Path:
    """What a follower receives for ``dump``: the transmission read to the end, in small chunks."""
    reader = codec.open_for_transmission(str(dump))
    with open(target, "wb") as f:
        while chunk := reader.read(4096):
            f.write(chunk)
    return target


def test_corrupted_state_file_is_detected(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    codec = sync_codec(filled(tmp_path / "a", 5), tmp_path / "work-a")
    codec.write(str(dump), RAFT_DATA)
    received = sent(codec, dump, tmp_path / "received")
    data = bytearray(received.read_bytes())
    position = data.index(b"\nA 3 ") + 3  # the record of index 3 now claims index 4
    data[position : position + 1] = b"4"
    received.write_bytes(bytes(data))
    target = ChainStateMachine(tmp_path / "b")
    with pytest.raises(SnapshotError, match="do not match the manifest"):
        SnapshotCodec(target, tmp_path / "work-b", tmp_path / "b-dump", background=False).read(str(received))
    assert target.applied_index() == 0


def test_compaction_keeps_a_checkpoint_and_a_small_dump_not_a_copy_of_the_state(tmp_path: Path) -> None:
    """The dump names a kept checkpoint; older checkpoints go once a newer dump is in place."""
    source = filled(tmp_path / "a", 2000)
    dump = tmp_path / "dump"
    codec = sync_codec(source, tmp_path / "work-a")
    codec.write(str(dump), at(2000))
    (first,) = codec.checkpoint_names()
    state_bytes = (tmp_path / "snapshots" / first / "chain.log").stat().st_size
    assert state_bytes > 100_000 and dump.stat().st_size < 20_000, "the dump holds no state file"
    with tarfile.open(dump) as tar:
        assert tar.getnames() == [snapshot.RAFT_DATA_NAME, snapshot.CHECKPOINT_NAME]
    source.apply(2001, b"one more")
    codec.write(str(dump), at(2001))
    source.apply(2002, b"and one more")
    codec.write(str(dump), at(2002))  # (synchronous mode deletes at the next write, background at once)
    names = codec.checkpoint_names()
    assert first not in names and len(names) == 2 and names[-1].startswith("2002-")


def test_a_transmission_is_a_full_snapshot_made_from_the_checkpoint(tmp_path: Path) -> None:
    source = filled(tmp_path / "a", 3000)
    dump = tmp_path / "dump"
    codec = sync_codec(source, tmp_path / "work-a")
    codec.write(str(dump), at(3000))
    received = sent(codec, dump, tmp_path / "received")
    with tarfile.open(received) as tar:
        names = tar.getnames()
    assert names == [snapshot.RAFT_DATA_NAME, "state/chain.log", snapshot.MANIFEST_NAME]
    assert read_raft_data(str(received)) == at(3000)
    packed = tmp_path / "packed"  # the same as a snapshot packed from the state in one go
    state = tmp_path / "state-copy"
    shutil.copytree(tmp_path / "snapshots" / codec.checkpoint_names()[0], state)
    pack(state, at(3000), packed)
    assert len(packed.read_bytes()) == len(received.read_bytes())
    target = ChainStateMachine(tmp_path / "b")
    target_codec = SnapshotCodec(target, tmp_path / "work-b", tmp_path / "b" / "dump", background=False)
    assert target_codec.read(str(received)) == at(3000)
    assert target.applied_index() == 3000 and target.chain() == source.chain()


def test_a_transmission_in_progress_outlives_the_checkpoint_it_reads(tmp_path: Path) -> None:
    """A newer compaction deletes the old checkpoint while a follower is still being sent it."""
    source = filled(tmp_path / "a", 7)
    dump = tmp_path / "dump"
    codec = sync_codec(source, tmp_path / "work-a")
    codec.write(str(dump), RAFT_DATA)
    reader = codec.open_for_transmission(str(dump))
    head = reader.read(1024)
    source.apply(8, b"one more")
    codec.write(str(dump), at(8))
    codec.write(str(dump), at(8))  # the first checkpoint is gone now
    assert not any(name.startswith("7-") for name in codec.checkpoint_names())
    received = tmp_path / "received"
    with open(received, "wb") as f:
        f.write(head)
        while chunk := reader.read(4096):
            f.write(chunk)
    target = ChainStateMachine(tmp_path / "b")
    SnapshotCodec(target, tmp_path / "work-b", tmp_path / "b" / "dump", background=False).read(str(received))
    assert target.applied_index() == 7


def test_a_dump_whose_checkpoint_is_missing_or_damaged_is_refused(tmp_path: Path) -> None:
    """Even a state machine ahead of the snapshot refuses it: the dump could not be sent."""
    source = filled(tmp_path / "a", 9)
    dump = tmp_path / "dump"
    sync_codec(source, tmp_path / "work-a").write(str(dump), RAFT_DATA)
    damage_kept_checkpoint(tmp_path)
    with pytest.raises(SnapshotError, match="has .* bytes, the snapshot says"):
        sync_codec(source, tmp_path / "work-a").read(str(dump))
    shutil.rmtree(tmp_path / "snapshots")
    with pytest.raises(FileNotFoundError):
        SnapshotCodec(source, tmp_path / "work-a", dump, background=False).read(str(dump))


def test_installing_a_full_snapshot_drops_the_kept_checkpoints(tmp_path: Path) -> None:
    dump = tmp_path / "node" / "dump"
    dump.parent.mkdir()
    codec = SnapshotCodec(filled(tmp_path / "a", 5), tmp_path / "node" / "work", dump, background=False)
    codec.write(str(dump), RAFT_DATA)
    assert len(codec.checkpoint_names()) == 1
    leader = filled(tmp_path / "leader", 9)
    leader.write_snapshot(str(tmp_path / "leader-state"))
    pack(tmp_path / "leader-state", ((b"", 9, 3), (b"", 8, 3), set()), dump)  # what pysyncobj received
    codec.read(str(dump))
    assert codec.checkpoint_names() == []


def test_paths_escaping_the_state_directory_are_rejected(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    with tarfile.open(dump, "w:") as tar:
        for name, payload in [("raft-data.pickle", __import__("pickle").dumps(RAFT_DATA)),
                              ("state/../../escape", b"x")]:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(SnapshotError, match="unsafe path"):
        sync_codec(ChainStateMachine(tmp_path / "b"), tmp_path / "work").read(str(dump))
    assert not (tmp_path / "escape").exists()


def test_snapshot_index_validates_raft_data() -> None:
    assert snapshot_index(RAFT_DATA) == 7
    for bad in [None, (1, 2), ((b"", "7", 1), None, None), ((b"", 0, 1), None, None)]:
        with pytest.raises(SnapshotError):
            snapshot_index(bad)


def test_node_that_cannot_restore_its_snapshot_halts(single_node: Callable[..., Any]) -> None:
    """pysyncobj would log the error and run on without the state: the replicator stops instead."""
    rep, sm = single_node()
    outcomes = Outcomes()
    for i in range(5):
        rep.submit(b"cmd %d" % i, outcomes.callback(i))
    outcomes.wait(5)
    rep.force_compaction()
    dump = rep.data_dir / DUMP_FILE_NAME
    wait_until(lambda: dump.exists(), 5, "the snapshot file")
    rep.close()
    sm.close()
    damage_kept_checkpoint(rep.data_dir)
    shutil.rmtree(sm.log_path.parent)  # a fresh state machine must restore from the snapshot

    fresh = ChainStateMachine(sm.log_path.parent)
    again = PysyncobjReplicator(rep.status().self_address, [], rep.data_dir, fresh, FAST_OPTIONS)
    again.start()
    try:
        wait_until(lambda: again.failure is not None, 5, "the restore to fail")
        assert isinstance(again.failure, SnapshotError)
        assert again.status().role is Role.FOLLOWER and fresh.applied_index() == 0
        reason = again.status().halted_reason
        assert reason is not None and reason.startswith("SnapshotError"), "the halt is visible in the status"
        late = Outcomes()
        again.submit(b"x", late.callback(0))
        error = late.results[0][1]
        assert error is not None and error.reason is FailReason.NO_LEADER
    finally:
        again.close()
        fresh.close()


def gate_keep(codec: SnapshotCodec, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold the codec's background job until the returned event is set."""
    gate = threading.Event()
    real_keep = codec._keep

    def gated_keep(*args: Any) -> None:
        assert gate.wait(10)
        real_keep(*args)

    monkeypatch.setattr(codec, "_keep", gated_keep)
    return gate


def test_background_job_reports_running_then_moves_the_file_into_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = tmp_path / "dump"
    codec = SnapshotCodec(filled(tmp_path / "a", 5), tmp_path / "work", dump)
    gate = gate_keep(codec, monkeypatch)
    assert codec.poll() is PackState.IDLE
    with pytest.raises(SerializingInBackground):
        codec.write(str(dump) + ".tmp", RAFT_DATA)
    assert codec.poll() is PackState.RUNNING and not dump.exists()
    gate.set()
    assert wait_until(lambda: codec.poll() is not PackState.RUNNING or None, 5, "the pack") is True
    assert dump.exists() and codec.poll() is PackState.IDLE
    target = ChainStateMachine(tmp_path / "b")
    SnapshotCodec(target, tmp_path / "work-b", dump).read(str(dump))
    assert target.applied_index() == 7


def test_background_job_never_replaces_a_snapshot_installed_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = tmp_path / "installed"
    leader = filled(tmp_path / "leader", 9)
    leader.write_snapshot(str(tmp_path / "leader-state"))
    pack(tmp_path / "leader-state", ((b"", 9, 3), (b"", 8, 3), set()), installed)
    dump = tmp_path / "dump"
    codec = SnapshotCodec(filled(tmp_path / "a", 5), tmp_path / "work", dump)
    gate = gate_keep(codec, monkeypatch)
    with pytest.raises(SerializingInBackground):
        codec.write(str(dump) + ".tmp", RAFT_DATA)
    shutil.copyfile(installed, dump)  # what pysyncobj does when the leader sends a snapshot...
    codec.read(str(dump))  # ...before it calls the deserializer
    gate.set()
    wait_until(lambda: codec.poll() is not PackState.RUNNING, 5, "the pack")
    assert dump.read_bytes() == installed.read_bytes()
    assert codec.checkpoint_names() == [], "the discarded job's checkpoint is deleted"


def test_a_failing_state_machine_snapshot_is_reported_once_as_failed(tmp_path: Path) -> None:
    class Failing(ChainStateMachine):
        def write_snapshot(self, directory: str) -> None:
            raise OSError("disk full")

    codec = SnapshotCodec(Failing(tmp_path / "a"), tmp_path / "work", tmp_path / "dump")
    with pytest.raises(OSError):
        codec.write(str(tmp_path / "dump.tmp"), RAFT_DATA)
    assert codec.poll() is PackState.FAILED  # pysyncobj only retries after hearing this
    assert codec.poll() is PackState.IDLE
