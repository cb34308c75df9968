"""SnapshotCodec: the single tar file pysyncobj stores at compaction and streams to followers."""

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
    snapshot_index,
)

from .chain_sm import ChainStateMachine, read_records
from .cluster import wait_until
from .conftest import FAST_OPTIONS, Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

RAFT_DATA = ((b"\x00cmd", 7, 2), (b"\x01", 6, 2), {"127.0.0.1:1", "127.0.0.1:2"})


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


def test_corrupted_state_file_is_detected(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    sync_codec(filled(tmp_path / "a", 5), tmp_path / "work-a").write(str(dump), RAFT_DATA)
    data = bytearray(dump.read_bytes())
    position = data.index(b"\nA 3 ") + 3  # the record of index 3 now claims index 4
    data[position : position + 1] = b"4"
    dump.write_bytes(bytes(data))
    target = ChainStateMachine(tmp_path / "b")
    with pytest.raises(SnapshotError, match="do not match the manifest"):
        sync_codec(target, tmp_path / "work-b").read(str(dump))
    assert target.applied_index() == 0


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
    data = bytearray(dump.read_bytes())
    position = data.index(b"\nA 4 ") + 3
    data[position : position + 1] = b"5"
    dump.write_bytes(bytes(data))
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


def test_background_pack_reports_running_then_moves_the_file_into_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    real_pack = snapshot.pack

    def gated_pack(state_dir: Path, raft_data: object, target: Path) -> int:
        assert gate.wait(10)
        return real_pack(state_dir, raft_data, target)

    monkeypatch.setattr(snapshot, "pack", gated_pack)
    dump = tmp_path / "dump"
    codec = SnapshotCodec(filled(tmp_path / "a", 5), tmp_path / "work", dump)
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


def test_background_pack_never_replaces_a_snapshot_installed_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = tmp_path / "installed"
    sync_codec(filled(tmp_path / "leader", 9), tmp_path / "work-l").write(
        str(installed), ((b"", 9, 3), (b"", 8, 3), set()))
    gate = threading.Event()
    real_pack = snapshot.pack
    monkeypatch.setattr(snapshot, "pack", lambda *args: gate.wait(10) and real_pack(*args))
    dump = tmp_path / "dump"
    codec = SnapshotCodec(filled(tmp_path / "a", 5), tmp_path / "work", dump)
    with pytest.raises(SerializingInBackground):
        codec.write(str(dump) + ".tmp", RAFT_DATA)
    shutil.copyfile(installed, dump)  # what pysyncobj does when the leader sends a snapshot...
    codec.read(str(dump))  # ...before it calls the deserializer
    gate.set()
    wait_until(lambda: codec.poll() is not PackState.RUNNING, 5, "the pack")
    assert dump.read_bytes() == installed.read_bytes()


def test_a_failing_state_machine_snapshot_is_reported_once_as_failed(tmp_path: Path) -> None:
    class Failing(ChainStateMachine):
        def write_snapshot(self, directory: str) -> None:
            raise OSError("disk full")

    codec = SnapshotCodec(Failing(tmp_path / "a"), tmp_path / "work", tmp_path / "dump")
    with pytest.raises(OSError):
        codec.write(str(tmp_path / "dump.tmp"), RAFT_DATA)
    assert codec.poll() is PackState.FAILED  # pysyncobj only retries after hearing this
    assert codec.poll() is PackState.IDLE
