"""The durable Raft journal: recovery, torn tails, segments and compaction, the power-loss simulation, which
entries need a sync, and the transport that holds messages back until the journal is synced."""

from __future__ import annotations

import os
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import pysyncobj.pickle as pysyncobj_pickle
import pytest
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from broker.replication import raft
from broker.replication.journal import (
    ENTRY,
    HEADER_BYTES,
    LEGACY_MARKER,
    MAGIC,
    MAGIC_ZLIB,
    DurableJournal,
    JournalError,
    segment_name,
    segment_sequences,
)
from broker.replication.raft_node import keep_entries_after_snapshot

from .chain_sm import ChainStateMachine
from .cluster import free_port

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

PLAIN_ID = raft._RaftNode._METHOD_IDS[raft._APPLY_METHOD]
SYNCED_ID = raft._RaftNode._METHOD_IDS[raft._SYNCED_APPLY_METHOD]


def command(method_id: int, payload: bytes = b"payload") -> bytes:
    """A log entry's command as pysyncobj builds it for a @replicated call."""
    return b"\x00" + pysyncobj_pickle.dumps((method_id, (payload,)))


def synced_flag(cmd: bytes) -> bool:
    return raft.command_needs_sync(cmd, SYNCED_ID)


def open_journal(path: Path, **kwargs: Any) -> DurableJournal:
    return DurableJournal(path, needs_sync=synced_flag, **kwargs)


def crash(journal: DurableJournal) -> None:
    """A process crash: the descriptor goes away without the final fsync of a clean close (the
    deletion of passed segments is let finish first: a test that wants them left puts them back)."""
    journal.settle()
    journal._close_last()


def last_segment(path: Path) -> Path:
    return path / segment_name(segment_sequences(path)[-1])


def entries(journal: DurableJournal) -> list[tuple[int, int]]:
    return [(journal[i][1], journal[i][2]) for i in range(len(journal))]


def test_methods_get_the_ids_pysyncobj_gives_them() -> None:
    assert (PLAIN_ID, SYNCED_ID) == (0, 1)  # sorted by name; existing logs keep id 0 for plain applies


@pytest.mark.parametrize("size", [0, 10, 300, 70_000])
def test_only_synced_applies_membership_and_version_entries_need_a_sync(size: int) -> None:
    payload = os.urandom(size)
    assert synced_flag(command(SYNCED_ID, payload))
    assert not synced_flag(command(PLAIN_ID, payload))
    assert not synced_flag(b"\x01")  # no-op
    assert synced_flag(b"\x02" + pysyncobj_pickle.dumps(["add", "x", "x"]))  # membership
    assert synced_flag(b"\x00garbage")  # unknown shape: synced, to be safe


def test_entries_term_vote_truncation_and_commit_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path)
    for index in range(1, 6):
        journal.add(command(PLAIN_ID, b"e%d" % index), index, 1)
    journal.setCurrentTerm(2, "127.0.0.1:1")
    journal.deleteEntriesFrom(3)  # list position 3: index 4 and after
    journal.add(command(SYNCED_ID), 4, 2)
    journal.setRaftCommitIndex(3)
    journal.onOneSecondTimer()  # the commit index is written lazily
    journal._destroy()
    again = open_journal(path)
    assert entries(again) == [(1, 1), (2, 1), (3, 1), (4, 2)]
    assert again[0][0] == command(PLAIN_ID, b"e1")
    assert (again.getCurrentTerm(), again.getVotedForNodeId(), again.getRaftCommitIndex()) == (2, "127.0.0.1:1", 3)
    again._destroy()


def test_a_truncation_is_told_with_the_first_index_it_drops(tmp_path: Path) -> None:
    """``on_truncate``: the state machine learns that later commands at those indexes are new ones
    (``StateMachine.journal_truncated``), not replays of what the journal held at its start."""
    told: list[int] = []
    journal = open_journal(tmp_path / "raft.wal", on_truncate=told.append)
    for index in range(1, 6):
        journal.add(command(PLAIN_ID, b"e%d" % index), index, 1)
    journal.deleteEntriesFrom(7)  # past the end: nothing dropped, nothing told
    journal.deleteEntriesFrom(3)  # list position 3: index 4 and after
    assert told == [4]
    journal._destroy()


def test_a_torn_last_record_is_cut_off(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path)
    journal.add(command(PLAIN_ID), 1, 1)
    journal.add(command(PLAIN_ID), 2, 1)
    crash(journal)  # neither record was fsynced: a crash may tear the last one
    segment = last_segment(path)
    whole = segment.stat().st_size
    with open(segment, "r+b") as f:
        f.truncate(whole - 3)  # the second record loses its last bytes
    again = open_journal(path)
    assert entries(again) == [(1, 1)]
    again.add(command(PLAIN_ID), 2, 1)  # appends continue after the last whole record
    again._destroy()
    assert entries(open_journal(path)) == [(1, 1), (2, 1)]


def test_damage_inside_what_was_fsynced_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path)
    journal.add(command(SYNCED_ID), 1, 1)
    journal.add(command(SYNCED_ID), 2, 1)
    journal.sync()
    crash(journal)
    segment = last_segment(path)
    clean = segment.read_bytes()
    flipped = bytearray(clean)
    flipped[-30] ^= 0xFF  # a bit flip in an fsynced record, not a torn write
    segment.write_bytes(bytes(flipped))
    with pytest.raises(JournalError, match="corrupt record at offset"):
        open_journal(path)
    segment.write_bytes(clean[:-5])  # fsynced bytes missing: damage too
    with pytest.raises(JournalError, match="corrupt record at offset"):
        open_journal(path)
    segment.write_bytes(clean)
    assert entries(open_journal(path)) == [(1, 1), (2, 1)]


def test_a_file_that_is_not_a_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    path.mkdir()
    (path / segment_name(1)).write_bytes(b"PYSYNCOBJ" + bytes(40))
    with pytest.raises(JournalError, match="not a raftbroker journal segment"):
        open_journal(path)


def _legacy_file(entries_: list[tuple[bytes, int, int]], term: int, voted_for: str, *, magic: bytes) -> bytes:
    """A single-file journal as earlier releases wrote it (magic RBJRNL01 with zlib's CRC-32, or
    RBJRNL02 with CRC32C), built here from its layout, not by the module: header (generation 7), a
    TERM record, then ENTRY records; all of it synced."""
    crc = zlib.crc32 if magic == MAGIC_ZLIB else (lambda data: int(google_crc32c.value(data)))

    def record(kind: int, payload: bytes) -> bytes:
        body = bytes((kind,)) + payload
        return struct.pack("<II", len(body), crc(body)) + body

    records = record(3, struct.pack("<Q", term) + b"\x01" + voted_for.encode())
    for cmd, index, entry_term in entries_:
        records += record(1, struct.pack("<QQ", index, entry_term) + cmd)
    head = magic + struct.pack("<Q", 7)
    synced = struct.pack("<Q", HEADER_BYTES + len(records))
    return head + struct.pack("<I", crc(head)) + synced + struct.pack("<I", crc(synced)) + records


@pytest.mark.parametrize("magic", [MAGIC_ZLIB, MAGIC])
def test_a_single_file_journal_of_earlier_releases_becomes_the_first_segment(tmp_path: Path, magic: bytes) -> None:
    """Nodes upgraded in place keep their journals: the single file is moved in as segment 1 and
    opens with its entries; a first-format (zlib) one takes appends in its own checksum until it is
    sealed, and the next segment is CRC32C."""
    legacy, path = tmp_path / "raft.journal", tmp_path / "journal"
    old = [(command(PLAIN_ID, b"old%d" % index), index, 1) for index in range(1, 4)]
    legacy.write_bytes(_legacy_file(old, 1, "127.0.0.1:9", magic=magic))
    journal = open_journal(path, legacy_file=legacy, segment_bytes=4096)
    assert journal.segment_paths == [path / segment_name(1)]
    # in the old file's place: a marker that an earlier release refuses (bad header), never an empty journal
    assert legacy.read_bytes()[:8] == LEGACY_MARKER and LEGACY_MARKER not in (MAGIC, MAGIC_ZLIB)
    assert [journal[i] for i in range(len(journal))] == old
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId(), journal.generation) == (1, "127.0.0.1:9", 1)
    journal.add(command(SYNCED_ID, b"new"), 4, 2)
    journal.sync()
    crash(journal)
    assert (path / segment_name(1)).read_bytes()[:8] == magic
    journal = open_journal(path, legacy_file=legacy, segment_bytes=4096)
    assert entries(journal) == [(1, 1), (2, 1), (3, 1), (4, 2)]
    journal.add(command(PLAIN_ID, os.urandom(5000)), 5, 2)  # fills segment 1
    journal.add(command(PLAIN_ID, b"next"), 6, 2)  # goes to segment 2
    journal._destroy()
    assert [p.read_bytes()[:8] for p in journal.segment_paths] == [magic, MAGIC]
    journal = open_journal(path, legacy_file=legacy, segment_bytes=4096)
    assert entries(journal) == [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)]
    assert journal[3][0] == command(SYNCED_ID, b"new") and journal.getVotedForNodeId() == "127.0.0.1:9"
    journal._destroy()
    legacy.write_bytes(_legacy_file(old, 1, "127.0.0.1:9", magic=magic))  # a journal beside the segments
    with pytest.raises(JournalError, match="beside the segments"):
        open_journal(path, legacy_file=legacy)


def test_sync_is_pending_after_term_and_synced_entries_only(tmp_path: Path) -> None:
    journal = open_journal(tmp_path / "raft.wal")
    journal.add(command(PLAIN_ID), 1, 0)
    assert not journal.sync_pending and journal.unsynced_bytes > 0
    journal.add(command(SYNCED_ID), 2, 0)
    assert journal.sync_pending
    assert journal.sync() and not journal.sync_pending and journal.unsynced_bytes == 0
    assert not journal.sync()  # nothing pending: no fsync
    journal.setCurrentTerm(1, None)
    assert journal.sync_pending  # term and vote are always synced
    journal._destroy()


def test_sync_all_and_never(tmp_path: Path) -> None:
    every = open_journal(tmp_path / "all.wal", sync_entries="all")
    every.add(command(PLAIN_ID), 1, 0)
    assert every.sync_pending
    never = open_journal(tmp_path / "never.wal", sync_entries="never")
    never.add(command(SYNCED_ID), 1, 0)
    assert not never.sync_pending
    never.setCurrentTerm(1, None)
    assert never.sync_pending  # Raft safety is never switched off


def test_power_loss_simulation_drops_exactly_what_was_not_synced(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path, simulate_power_loss=True)
    journal.setCurrentTerm(3, "a:1")
    journal.add(command(SYNCED_ID), 1, 3)
    journal.sync()
    journal.add(command(PLAIN_ID), 2, 3)  # written, never synced
    journal.setRaftCommitIndex(2)
    journal.onOneSecondTimer()  # the periodic fsync also counts as synced...
    journal.add(command(PLAIN_ID), 3, 3)  # ...but this comes after it
    crash(journal)
    again = open_journal(path, simulate_power_loss=True)
    assert entries(again) == [(1, 3), (2, 3)]
    assert again.getCurrentTerm() == 3 and again.getRaftCommitIndex() == 2 and again.dropped_bytes > 0
    crash(again)
    # without the simulation the same file keeps everything a process crash leaves behind
    assert entries(open_journal(path)) == [(1, 3), (2, 3)]


def test_without_syncs_a_simulated_power_loss_takes_everything_since_the_last_one(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path, simulate_power_loss=True, sync_entries="never")
    journal.setCurrentTerm(1, None)
    journal.sync()
    journal.add(command(SYNCED_ID), 1, 1)
    journal.onOneSecondTimer()  # switched off with the entry syncs
    crash(journal)
    again = open_journal(path, simulate_power_loss=True)
    assert entries(again) == [] and again.getCurrentTerm() == 1


def test_compaction_drops_the_prefix_after_the_snapshot_barrier_and_writes_one_record(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    barriers: list[int] = []
    journal = open_journal(path, simulate_power_loss=True, snapshot_barrier=lambda: barriers.append(1))
    for index in range(1, 11):
        journal.add(command(PLAIN_ID), index, 1)
    journal.setCurrentTerm(1, "a:1")
    journal.sync()
    size, generation = last_segment(path).stat().st_size, journal.generation
    journal.deleteEntriesTo(7)  # keep list positions 7.. (indexes 8..10)
    assert barriers == [1] and journal.generation == generation  # no new file: one COMPACT record
    assert 0 < last_segment(path).stat().st_size - size < 40 and not journal.sync_pending
    saved = last_segment(path).read_bytes()
    journal.onOneSecondTimer()  # the periodic fsync: the COMPACT record is durable from here on
    crash(journal)
    durable = last_segment(path).read_bytes()
    last_segment(path).write_bytes(saved)  # a power loss just before that fsync keeps the prefix: harmless
    assert entries(open_journal(path, simulate_power_loss=True)) == [(index, 1) for index in range(1, 11)]
    last_segment(path).write_bytes(durable)
    again = open_journal(path, simulate_power_loss=True)
    assert entries(again) == [(8, 1), (9, 1), (10, 1)] and again.getVotedForNodeId() == "a:1"
    again.clear()
    assert barriers == [1] and len(again) == 0 and len(again.segment_paths) == 1
    crash(again)
    again = open_journal(path, simulate_power_loss=True)
    assert len(again) == 0 and again.getVotedForNodeId() == "a:1"


def test_a_compaction_lost_in_a_power_loss_keeps_the_entries_after_the_snapshot(tmp_path: Path) -> None:
    """A compaction appends its COMPACT record unsynced, after the entries appended while its
    snapshot was written; a power loss takes that record and the log begins before the snapshot
    again. pysyncobj's load keeps a log only if it begins with the snapshot's last two entries, and
    otherwise clears it: entries after the snapshot, fsynced and acknowledged, were thrown away (the
    power-loss drill lost acknowledged batches of an `fsync` topic so, 2026-12-05). At start the
    node first drops the entries the snapshot covers (``keep_entries_after_snapshot``)."""
    path = tmp_path / "raft.wal"
    journal = open_journal(path, simulate_power_loss=True)
    journal.setCurrentTerm(2, "a:1")
    for index in range(1, 11):
        journal.add(command(SYNCED_ID, b"c%d" % index), index, 1 if index < 4 else 2)
    journal.sync()  # entries 7..10 came after the snapshot at 6 and were acknowledged
    snapshot = (journal[4], journal[5])  # (the entry before the last applied one, the last applied: 5 and 6)
    journal.deleteEntriesTo(4)  # pysyncobj's compaction for that snapshot: the log begins at 5
    crash(journal)  # before any fsync: the COMPACT record is lost
    again = open_journal(path, simulate_power_loss=True)
    assert entries(again) == [(1, 1), (2, 1), (3, 1)] + [(i, 2) for i in range(4, 11)], "the COMPACT was lost"
    stock_keeps = len(again) >= 2 and again[0] == snapshot[0] and again[1] == snapshot[1]
    assert not stock_keeps, "pysyncobj's load would clear this log, entries 7..10 with it"

    assert keep_entries_after_snapshot(again, *snapshot)
    assert entries(again) == [(i, 2) for i in range(5, 11)]
    assert again[0] == snapshot[0] and again[1] == snapshot[1], "pysyncobj's load now keeps the log"
    crash(again)
    assert entries(open_journal(path)) == [(i, 2) for i in range(5, 11)], "a crash keeps what was kept"


@pytest.mark.parametrize("case", ["ends before the snapshot", "another term at its index", "already aligned"])
def test_a_log_that_does_not_hold_the_snapshot_entries_is_left_to_pysyncobj(tmp_path: Path, case: str) -> None:
    journal = open_journal(tmp_path / "raft.wal")
    for index in range(1, 6):
        journal.add(command(SYNCED_ID), index, 1)
    before, last = (b"x", 5, 1), (b"y", 6, 1)  # the snapshot's entries (commands are not compared)
    if case == "another term at its index":
        journal.add(command(SYNCED_ID), 6, 1)
        before, last = (b"x", 5, 1), (b"y", 6, 2)
    elif case == "already aligned":
        journal.deleteEntriesTo(4)
        journal.add(command(SYNCED_ID), 6, 1)
    held = entries(journal)
    assert not keep_entries_after_snapshot(journal, before, last)
    assert entries(journal) == held


def fill(journal: DurableJournal, first: int, last: int, size: int = 300) -> None:
    for index in range(first, last + 1):
        journal.add(command(PLAIN_ID, os.urandom(size)), index, 1)


def test_segments_are_sealed_whole_and_a_power_loss_keeps_them(tmp_path: Path) -> None:
    """A full segment is fsynced and its header records its whole length before the next one starts,
    so the power-loss simulation (cut every segment to its synced length) keeps every sealed entry."""
    path = tmp_path / "raft.wal"
    journal = open_journal(path, simulate_power_loss=True, sync_entries="never", segment_bytes=4096)
    journal.setCurrentTerm(2, "b:2")
    fill(journal, 1, 40)  # ~12 KiB: three sealed segments and a fourth being written
    assert len(journal.segment_paths) >= 4
    sealed = journal.segment_paths[:-1]
    crash(journal)
    for segment in sealed:
        data = segment.read_bytes()
        assert struct.unpack_from("<Q", data, 20)[0] == len(data)  # synced length: all of it
    again = open_journal(path, simulate_power_loss=True, segment_bytes=4096)
    held = entries(again)
    assert held == [(index, 1) for index in range(1, len(held) + 1)] and len(held) >= 30
    assert again.dropped_bytes > 0 and (again.getCurrentTerm(), again.getVotedForNodeId()) == (2, "b:2")


def test_a_compaction_deletes_only_the_segments_wholly_before_the_first_kept_entry(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    barriers: list[int] = []
    journal = open_journal(path, segment_bytes=4096, snapshot_barrier=lambda: barriers.append(1))
    fill(journal, 1, 60)
    first_indexes = {p: open_segment_indexes(p) for p in journal.segment_paths}
    keep = 25
    journal.deleteEntriesTo(keep - 1)  # indexes keep.. stay
    assert barriers == [1] and entries(journal)[0] == (keep, 1)
    journal.settle()  # the files go on the deleter thread
    gone = [p for p, held in first_indexes.items() if held and max(held) < keep]
    assert gone and all(not p.exists() for p in gone)
    assert all(p.exists() for p, held in first_indexes.items() if not held or max(held) >= keep)
    assert journal.segment_paths == sorted(p for p in first_indexes if p.exists())
    fill(journal, 61, 70)
    crash(journal)
    again = open_journal(path, segment_bytes=4096)
    assert entries(again) == [(index, 1) for index in range(keep, 71)]
    again.deleteEntriesTo(len(again) - 1)  # everything but the last entry
    assert len(again.segment_paths) <= 2
    again._destroy()
    assert entries(open_journal(path, segment_bytes=4096)) == [(70, 1)]


def test_passed_segments_are_unlinked_off_the_replication_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unlink of a large file takes tens of ms: the compaction's caller does not wait for it."""
    unlinked_on: list[str] = []
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.suffix == ".seg":
            unlinked_on.append(threading.current_thread().name)
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    journal = open_journal(tmp_path / "raft.wal", segment_bytes=4096)
    fill(journal, 1, 40)
    journal.deleteEntriesTo(35)
    journal.settle()
    assert unlinked_on and all(name.startswith("journal-io") for name in unlinked_on)
    journal._destroy()


def open_segment_indexes(segment: Path) -> list[int]:
    """The entry indexes a segment file holds, read from its records."""
    return [struct.unpack_from("<Q", record, 9)[0] for record in _entry_records(segment.read_bytes())]


def test_a_truncation_reaches_back_into_a_sealed_segment(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path, segment_bytes=4096)
    fill(journal, 1, 30)
    assert len(journal.segment_paths) >= 3
    journal.deleteEntriesFrom(5)  # list position 5: index 6 and after, most of them sealed
    journal.add(command(PLAIN_ID, b"new"), 6, 2)
    crash(journal)
    again = open_journal(path, segment_bytes=4096)
    assert entries(again) == [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2)]
    again.deleteEntriesTo(5)  # the sealed segments still hold index 6..30 (truncated): they stay
    again._destroy()
    assert entries(open_journal(path, segment_bytes=4096)) == [(6, 2)]


def test_a_clear_cut_short_by_a_crash_still_drops_every_entry(tmp_path: Path) -> None:
    """``clear`` starts a new segment whose COMPACT drops every entry, then deletes the older ones: a
    crash between the two leaves old segments that the replay must not resurrect."""
    path = tmp_path / "raft.wal"
    journal = open_journal(path, segment_bytes=4096)
    journal.setCurrentTerm(3, "c:3")
    fill(journal, 1, 30)
    saved = {p: p.read_bytes() for p in journal.segment_paths}
    journal.clear()
    journal.add(command(PLAIN_ID, b"after"), 31, 3)
    crash(journal)
    for segment, data in saved.items():  # as if the deletes had not happened
        segment.write_bytes(data)
    again = open_journal(path, segment_bytes=4096)
    assert entries(again) == [(31, 3)] and again.getVotedForNodeId() == "c:3"


def test_a_missing_segment_is_refused_and_a_half_created_one_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path, segment_bytes=4096)
    fill(journal, 1, 30)
    journal._destroy()
    staged = path / (segment_name(99) + ".new")
    staged.write_bytes(b"half")  # a crash while a segment was being created: never renamed
    open_journal(path, segment_bytes=4096)._destroy()
    assert not staged.exists()
    journal.segment_paths[1].unlink()
    with pytest.raises(JournalError, match=f"segment {segment_name(2)} is missing"):
        open_journal(path, segment_bytes=4096)


# --- the send gate ------------------------------------------------------------------------------

class FakeConnection:
    state = CONNECTION_STATE.CONNECTED

    def disconnect(self) -> None:
        self.state = CONNECTION_STATE.DISCONNECTED


@pytest.fixture
def gated_follower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, list[Any]]]:
    """A follower without a tick thread whose transport records what actually goes on the wire."""
    sent: list[Any] = []

    def send(self: TCPTransport, node: object, message: object) -> bool:
        sent.append(message)
        return True

    monkeypatch.setattr(TCPTransport, "send", send)
    sm = ChainStateMachine(tmp_path / "sm")
    conf = raft.RaftOptions().to_conf(tmp_path / "raft.wal", tmp_path / "dump", lambda f, d: None, lambda f: ())
    conf.autoTick = False
    peers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    node = raft._RaftNode(f"127.0.0.1:{free_port()}", peers, conf, sm, 1 << 30)
    transport = node._SyncObj__transport
    for peer in node.otherNodes:
        transport._connections[peer] = FakeConnection()
    yield node, sent
    node.destroy()
    sm.close()


def deliver(node: Any, entries_: list[tuple[bytes, int, int]], prev: tuple[int, int]) -> None:
    leader = sorted(node.otherNodes, key=lambda n: n.id)[0]
    node._SyncObj__onMessageReceived(leader, {
        "type": "append_entries", "term": 1, "commit_index": 1, "entries": entries_,
        "prevLogIdx": prev[0], "prevLogTerm": prev[1]})


def test_a_follower_acknowledges_a_synced_entry_only_after_the_fsync(gated_follower: tuple[Any, list[Any]]) -> None:
    node, sent = gated_follower
    journal = node.journal
    fsyncs = journal.fsyncs
    deliver(node, [(command(PLAIN_ID), 2, 1)], (1, 0))  # adopts term 1: a synced record
    assert sent == [] and journal.sync_pending
    node._poller.poll(0)
    assert [m["next_node_idx"] for m in sent] == [3] and journal.fsyncs == fsyncs + 1
    deliver(node, [(command(PLAIN_ID), 3, 1)], (2, 1))  # a plain entry: the reply leaves at once
    assert [m["next_node_idx"] for m in sent] == [3, 4] and not journal.sync_pending
    sent.clear()
    fsyncs = journal.fsyncs
    deliver(node, [(command(SYNCED_ID), 4, 1), (command(PLAIN_ID), 5, 1)], (3, 1))
    deliver(node, [(command(PLAIN_ID), 6, 1)], (5, 1))  # held too: replies keep their order
    assert sent == [] and node._SyncObj__transport.held_count == 2 and journal.sync_pending
    node._poller.poll(0)  # the tick's poll releases: one fsync, then both replies in order
    assert journal.fsyncs == fsyncs + 1 and not journal.sync_pending
    assert [m["next_node_idx"] for m in sent] == [6, 7]


def test_a_term_change_is_synced_before_the_reply(gated_follower: tuple[Any, list[Any]]) -> None:
    node, sent = gated_follower
    leader = sorted(node.otherNodes, key=lambda n: n.id)[0]
    node._SyncObj__onMessageReceived(leader, {
        "type": "request_vote", "term": 5, "last_log_index": 1, "last_log_term": 0})
    assert sent == [] and node.journal.sync_pending
    node.release_held_messages()
    assert [m["type"] for m in sent] == ["response_vote"] and node.journal.getCurrentTerm() == 5


def test_a_leader_sends_its_entries_first_and_syncs_before_it_reads_a_reply(
        gated_follower: tuple[Any, list[Any]]) -> None:
    node, sent = gated_follower
    node._SyncObj__connectedNodes.update(node.otherNodes)
    node._SyncObj__onBecomeLeader()
    node.release_held_messages()
    sent.clear()
    journal = node.journal
    fsyncs = journal.fsyncs
    node._apply_synced_command(b"payload", callback=lambda result, error: None)
    node._checkCommandsToApply()
    carried = [m for m in sent if m["type"] == "append_entries" and m.get("entries")]
    assert len(carried) == 2 and journal.sync_pending  # on the wire while the leader's fsync is pending
    node._poller.poll(0)  # the release before the poll: the leader's own fsync
    assert journal.fsyncs == fsyncs + 1 and not journal.sync_pending
    sent.clear()
    journal.setCurrentTerm(journal.getCurrentTerm() + 1, None)
    node._SyncObj__sendAppendEntries()
    assert sent == [] and node._SyncObj__transport.held_count == 2  # a pending term record holds even these


def test_a_failed_fsync_is_final(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from broker.replication import journal as journal_module

    journal = open_journal(tmp_path / "raft.wal")
    journal.add(command(SYNCED_ID), 1, 1)

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(journal_module, "_datasync", broken)
    with pytest.raises(OSError):
        journal.sync()
    monkeypatch.undo()  # the disk "recovers": the journal must not believe it
    assert journal.failure is not None and journal.sync_pending and journal.term_pending
    with pytest.raises(OSError):
        journal.sync()
    journal._destroy()  # closes without trying again



def test_the_periodic_fsync_runs_off_the_replication_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The once-a-second fsync of `disk` entries: the caller does not wait for it, what it covers counts
    as synced (header and power-loss simulation) once it is done, and a failure of it is final."""
    import errno

    from broker.replication import journal as journal_module

    release, calls = threading.Event(), []
    real = journal_module._datasync

    def slow(fd: int) -> None:
        calls.append(threading.current_thread().name)
        assert release.wait(10)
        real(fd)

    path = tmp_path / "raft.wal"
    journal = open_journal(path, simulate_power_loss=True)
    monkeypatch.setattr(journal_module, "_datasync", slow)
    journal.add(command(PLAIN_ID), 1, 1)
    journal.onOneSecondTimer()  # returns while the fsync waits
    assert journal.unsynced_bytes > 0 and not journal.sync_pending
    journal.onOneSecondTimer()  # one under way: no second one
    journal.add(command(PLAIN_ID), 2, 1)  # written after the fsync started: not covered by it
    release.set()
    journal.settle()
    assert len(calls) == 1 and calls[0].startswith("journal-io") and journal.background_fsyncs == 1
    monkeypatch.setattr(journal_module, "_datasync", real)
    crash(journal)
    again = open_journal(path, simulate_power_loss=True)
    assert entries(again) == [(1, 1)] and again.dropped_bytes > 0

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    again.add(command(PLAIN_ID), 2, 1)
    monkeypatch.setattr(journal_module, "_datasync", broken)
    again.onOneSecondTimer()
    again.settle()
    assert again.failure is not None and again.sync_pending  # the transport holds every message back
    with pytest.raises(OSError):
        again.sync()
    again._destroy()


def _entry_records(data: bytes) -> list[bytes]:
    """The raw ENTRY records of a journal file: length(4) crc(4) type(1) payload, after the header."""
    out, pos = [], HEADER_BYTES
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "little")
        end = pos + 8 + length
        if data[pos + 8] == ENTRY:
            out.append(data[pos:end])
        pos = end
    return out


def test_an_appended_entry_reopens_as_the_very_command(tmp_path: Path) -> None:
    """``add`` writes a command without copying it (the record head and the command through
    ``pwritev``, the CRC computed over both in place); the segment reopens with the very commands."""
    big, small = command(PLAIN_ID, os.urandom(200_000)), command(SYNCED_ID, b"x")
    journal = open_journal(tmp_path / "j")
    for index, cmd in enumerate([big, small, big], start=2):
        journal.add(cmd, index, 1)
    assert len(_entry_records(last_segment(tmp_path / "j").read_bytes())) == 3
    crash(journal)
    journal = open_journal(tmp_path / "j")
    assert [journal[i][0] for i in range(len(journal))] == [big, small, big]
    assert entries(journal) == [(2, 1), (3, 1), (4, 1)]


def test_only_the_newest_commands_are_held_in_memory_and_the_rest_is_read_back(tmp_path: Path) -> None:
    """Every held entry reads the same, by position and by slice, whether its command is cached or read
    back from a sealed segment, the active one or a reopened journal; truncations, compactions and
    clears keep the index and the cache in step; the cache stays near its limit."""
    path = tmp_path / "raft.wal"
    limit = 3000
    journal = open_journal(path, segment_bytes=4096, cache_bytes=limit)
    written: list[tuple[bytes, int, int]] = []
    for index in range(1, 61):
        cmd = command(PLAIN_ID, os.urandom(100 + (index * 37) % 400))
        journal.add(cmd, index, 1 + index // 20)
        written.append((cmd, index, 1 + index // 20))
        assert journal.cached_bytes <= limit + len(cmd)
    assert len(journal.segment_paths) >= 5 and journal.read_backs == 0

    def check(held: list[tuple[bytes, int, int]]) -> None:
        assert len(journal) == len(held)
        with pytest.raises(IndexError):
            journal[len(held)]
        assert [journal[i] for i in range(len(held))] == held
        assert [journal[-i] for i in range(1, len(held) + 1)] == held[::-1]
        assert journal[:] == held and journal[3:17] == held[3:17] and journal[len(held) - 2:] == held[-2:]
        assert journal[5:2] == [] and journal[0:0] == []
        first = held[0][1]
        assert journal.entries_from(first - 1) == [] and journal.entries_from(held[-1][1] + 1) == []
        if len(held) < 10:
            return
        assert journal.entries_from(first + 4, 6) == held[4:10]
        budget = sum(len(cmd) for cmd, _, _ in held[2:7])
        assert journal.entries_from(first + 2, None, budget) == held[2:7]  # cut after the one reaching it
        assert journal.entries_from(first + 2, None, budget + 1) == held[2:8]
        assert journal.entry_bytes(held[9][1]) == len(held[9][0]) and journal.entry_bytes(first - 1) is None

    check(written)
    assert journal.read_backs > 0  # the oldest ones came from the segments
    journal.deleteEntriesFrom(55)  # inside the cache
    journal.add(command(PLAIN_ID, b"new56"), 56, 9)
    written = written[:55] + [(command(PLAIN_ID, b"new56"), 56, 9)]
    check(written)
    journal.deleteEntriesFrom(10)  # far behind the cache: the new last entry is read back into it
    written = written[:10]
    check(written)
    fill_from = [(command(PLAIN_ID, os.urandom(300)), index, 10) for index in range(11, 41)]
    for entry in fill_from:
        journal.add(*entry)
    written += fill_from
    journal.deleteEntriesTo(7)
    written = written[7:]
    check(written)
    crash(journal)
    journal = open_journal(path, segment_bytes=4096, cache_bytes=limit)
    assert journal.cached_bytes == len(written[-1][0])  # after a reopen: the last entry only
    check(written)
    journal.clear()
    assert len(journal) == 0 and journal[:] == [] and journal.cached_bytes == 0
    journal.add(command(PLAIN_ID, b"a"), 100, 12)
    journal.add(command(PLAIN_ID, b"b"), 101, 12)
    check([(command(PLAIN_ID, b"a"), 100, 12), (command(PLAIN_ID, b"b"), 101, 12)])
    journal._destroy()


def test_damage_found_when_reading_back_fails_the_journal(tmp_path: Path) -> None:
    """A byte changed on disk after the journal opened (a bad sector, a stray writer): the entry is
    not returned damaged; the journal fails as after a failed write, and holds every message back."""
    path = tmp_path / "raft.wal"
    journal = open_journal(path, segment_bytes=4096, cache_bytes=0)
    fill(journal, 1, 30)
    sealed, at = journal.segment_paths[0], journal._offsets[1] + 40  # inside the command of entry 2
    assert journal._sequences[1] == 1 and at < sealed.stat().st_size
    with open(sealed, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert journal[0][1] == 1  # an undamaged entry of the same segment reads back
    assert journal[-1][1] == 30  # cached: no read
    with pytest.raises(JournalError, match="damaged"):
        journal[1]
    assert journal.failure is not None and journal.sync_pending
    journal._destroy()


def test_a_follower_far_behind_is_sent_entries_read_back_in_bounded_batches(tmp_path: Path) -> None:
    """pysyncobj slices the log from a follower's next index to its end, then cuts at the batch size;
    the node asks the journal for what it sends only, so a long log is not read back whole."""
    from broker.replication.raft_node import _RaftNode

    journal = open_journal(tmp_path / "raft.wal", segment_bytes=64 * 1024, cache_bytes=0)
    fill(journal, 1, 400, size=1000)
    node = _RaftNode.__new__(_RaftNode)  # only the journal is needed: no Raft, no sockets
    node.__dict__["_SyncObj__raftLog"] = journal
    before = journal.read_backs
    batch = node._SyncObj__getEntries(3, None, 10_000)
    assert [index for _, index, _ in batch] == list(range(3, 3 + len(batch))) and 9 <= len(batch) <= 11
    assert journal.read_backs - before == len(batch)
    assert node._SyncObj__getEntries(399, 5) == journal[398:400]
    assert node._SyncObj__getEntries(None) == [] and node._SyncObj__getEntries(0, 2) == []
    journal._destroy()


def test_one_pass_of_the_apply_reads_a_bounded_number_of_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pysyncobj's apply asks for every entry between its applied index and the commit index at once;
    the node hands it at most ``_APPLY_READ_MAX_BYTES`` of commands (the rest at the next tick)."""
    from broker.replication import raft_node
    from broker.replication.raft_node import _RaftNode

    monkeypatch.setattr(raft_node, "_APPLY_READ_MAX_BYTES", 10_000)
    journal = open_journal(tmp_path / "raft.wal", segment_bytes=64 * 1024, cache_bytes=0)
    fill(journal, 1, 400, size=1000)
    node = _RaftNode.__new__(_RaftNode)  # only the journal is needed: no Raft, no sockets
    node.__dict__["_SyncObj__raftLog"] = journal
    assert len(node._SyncObj__getEntries(1, 400)) == 400  # other callers: unchanged
    node._reading_for_apply = True
    batch = node._SyncObj__getEntries(1, 400)
    assert [index for _, index, _ in batch] == list(range(1, 1 + len(batch))) and 9 <= len(batch) <= 11
    assert len(node._SyncObj__getEntries(5, 1)) == 1
    journal._destroy()


def test_command_kinds_and_bytes_come_from_memory(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path, segment_bytes=256 * 1024, cache_bytes=0)
    commands = [command(PLAIN_ID, b"x" * 100_000), b"\x01", b"\x02membership", command(PLAIN_ID, b"y" * 80_000)]
    for index, cmd in enumerate(commands * 6, start=1):
        journal.add(cmd, index, 1)
    assert len(journal.segment_paths) >= 3  # large commands in sealed ones: their kinds come from the scan
    journal.deleteEntriesTo(2)  # positions 0-1 go: Raft indexes 3.. stay
    crash(journal)
    again = open_journal(path, segment_bytes=256 * 1024, cache_bytes=0)
    before = again.read_backs
    assert again.command_kinds(3, 9) == bytes([2, 0, 0, 1, 2, 0])
    assert again.command_kinds(0, 100) == bytes([2, 0, 0, 1] * 5 + [2, 0])  # indexes 3-24
    assert again.command_kinds(30, 40) == b""
    assert again.command_bytes(3, 5) == len(commands[2]) + len(commands[3])
    assert again.read_backs == before
    again._destroy()


# -- large records past the page cache (O_DIRECT) ------------------------------------------------
DIRECT_MIN = 8192
# 5 MiB + 1: a buffer of its own, unmapped after the write
_ODD_SIZES = [100, 70_001, 5, 9_000, 300, 131_073, 4_000, 200_000, 17, 5 * 1024 * 1024 + 1, 12_289]


def _fill_odd(journal: DurableJournal, first: int, seed: int) -> list[bytes]:
    """Entries of odd sizes from index ``first``: records that start and end anywhere in a block."""
    rng = __import__("random").Random(seed)
    commands = [command(PLAIN_ID, rng.randbytes(size)) for size in _ODD_SIZES]
    for index, cmd in enumerate(commands, start=first):
        journal.add(cmd, index, 1)
    return commands


def test_large_records_are_written_direct_and_reopen_whole_after_a_crash(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Records of at least ``direct_write_min_bytes`` go through O_DIRECT: the block holding the end is
    written again from memory and padded with zeros. Small records written through the page cache
    after them (a commit hint, a truncation), a crash that leaves the padding, a reopen that must
    cut it quietly and go on appending from the right bytes, and a clean close that leaves none."""
    path = tmp_path / "j"
    journal = open_journal(path, direct_write_min_bytes=DIRECT_MIN)
    journal.setCurrentTerm(1, "a:1")
    commands = _fill_odd(journal, 1, seed=1)
    journal.setRaftCommitIndex(5)
    journal.onOneSecondTimer()  # a COMMIT record (buffered) right after a direct write
    journal.settle()
    journal.deleteEntriesFrom(10)  # TRUNCATE: index 11 on goes
    replacement = command(SYNCED_ID, os.urandom(50_000))
    journal.add(replacement, 11, 2)
    expected = commands[:10] + [replacement]
    assert journal.direct_writes >= 6
    segment = last_segment(path)
    assert segment.stat().st_size > journal._size, "a direct write pads its last block"
    crash(journal)

    caplog.set_level("WARNING", logger="broker.replication.journal")
    journal = open_journal(path, direct_write_min_bytes=DIRECT_MIN)
    assert [journal[i][0] for i in range(len(journal))] == expected
    assert entries(journal) == [(i, 1) for i in range(1, 11)] + [(11, 2)]
    assert (journal.getCurrentTerm(), journal.getVotedForNodeId(), journal.getRaftCommitIndex()) == (1, "a:1", 5)
    assert segment.stat().st_size == journal._size and not caplog.records, "the padding is cut quietly"

    more = _fill_odd(journal, 12, seed=2)  # the first of them rewrites the block read back at open
    journal._destroy()
    assert segment.stat().st_size == struct.unpack_from("<Q", segment.read_bytes(), 20)[0], "no padding at rest"
    again = open_journal(path, direct_write_min_bytes=DIRECT_MIN)
    assert [again[i][0] for i in range(len(again))] == expected + more
    again._destroy()


def test_a_power_loss_keeps_the_direct_writes_that_were_synced_and_drops_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = open_journal(path, simulate_power_loss=True, direct_write_min_bytes=DIRECT_MIN)
    journal.setCurrentTerm(4, None)
    synced = [command(SYNCED_ID, os.urandom(size)) for size in (30_000, 70_001)]
    for index, cmd in enumerate(synced, start=1):
        journal.add(cmd, index, 4)
    assert journal.sync()
    before = journal.direct_writes  # the first record starts in block 0, which is always buffered
    journal.add(command(PLAIN_ID, os.urandom(90_000)), 3, 4)  # written, never synced
    assert before >= 1 and journal.direct_writes == before + 1
    crash(journal)
    again = open_journal(path, simulate_power_loss=True, direct_write_min_bytes=DIRECT_MIN)
    assert [again[i][0] for i in range(len(again))] == synced and again.dropped_bytes > 90_000
    again._destroy()


def test_sealed_segments_end_at_their_last_record(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = open_journal(path, segment_bytes=64 * 1024, direct_write_min_bytes=DIRECT_MIN)
    for index in range(1, 13):
        journal.add(command(PLAIN_ID, os.urandom(20_000)), index, 1)
    assert len(journal.segment_paths) >= 3 and journal.direct_writes > 0
    for segment in journal.segment_paths[:-1]:
        data = segment.read_bytes()
        assert struct.unpack_from("<Q", data, 20)[0] == len(data) and data[-1:] != b"\0"
    journal._destroy()


@pytest.mark.parametrize("refused", ["open", "write"])
def test_a_file_system_that_refuses_direct_writes_gets_buffered_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, refused: str) -> None:
    """Some file systems refuse O_DIRECT when the file is opened (EINVAL), others at the first write;
    either way every record is written through the page cache, and nothing is lost."""
    import errno

    real_open, real_pwrite = os.open, os.pwrite
    direct_fds: set[int] = set()

    def opening(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_DIRECT:
            if refused == "open":
                raise OSError(errno.EINVAL, "Invalid argument")
            fd = real_open(file, flags, *args, **kwargs)
            direct_fds.add(fd)
            return fd
        return real_open(file, flags, *args, **kwargs)

    def writing(fd: int, data: Any, offset: int) -> int:
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", opening)
    monkeypatch.setattr(os, "pwrite", writing)
    caplog.set_level("INFO", logger="broker.replication.journal")
    path = tmp_path / "j"
    journal = open_journal(path, direct_write_min_bytes=DIRECT_MIN)
    commands = _fill_odd(journal, 1, seed=3)
    assert journal.direct_writes == 0 and journal._dfd == -1
    assert sum("O_DIRECT refused" in r.getMessage() for r in caplog.records) == 1
    crash(journal)
    monkeypatch.undo()
    again = open_journal(path)
    assert [again[i][0] for i in range(len(again))] == commands
    again._destroy()


def test_below_the_threshold_or_with_direct_writes_off_nothing_is_written_direct(tmp_path: Path) -> None:
    for options, path in (({}, tmp_path / "default"), ({"direct_write_min_bytes": 0}, tmp_path / "off")):
        journal = open_journal(path, **options)
        journal.add(command(PLAIN_ID, os.urandom(5000)), 1, 1)
        journal.add(command(PLAIN_ID, os.urandom(50_000 if not options else 2_000_000)), 2, 1)
        assert journal.direct_writes == 0 and (journal._dfd == -1) == bool(options)
        journal._destroy()
    journal = open_journal(tmp_path / "big")
    journal.add(command(PLAIN_ID, os.urandom(5000)), 1, 1)
    journal.add(command(PLAIN_ID, os.urandom(100_000)), 2, 1)  # past the default's 64 KiB
    assert journal.direct_writes == 1
    journal._destroy()


# -- a restart reads little of the sealed segments -------------------------------------------------
LARGE = 70_000  # above the size whose commands a sealed segment's scan leaves unread (64 KiB)


def _fill_large(journal: DurableJournal, first: int, last: int) -> dict[int, bytes]:
    commands = {index: command(PLAIN_ID, os.urandom(LARGE)) for index in range(first, last + 1)}
    for index, cmd in commands.items():
        journal.add(cmd, index, 1 + index // 10)
    return commands


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0x10]))


def test_a_restart_does_not_read_the_large_commands_of_sealed_segments(tmp_path: Path) -> None:
    """Of a sealed segment (fsynced whole), a restart reads the small records and the header of each
    large entry; the commands are read (and their checksums checked) when they are read back."""
    path = tmp_path / "raft.wal"
    journal = open_journal(path, segment_bytes=1024 * 1024, cache_bytes=0)
    journal.setCurrentTerm(9, "b:2")
    commands = _fill_large(journal, 1, 30)
    journal.setRaftCommitIndex(30)
    journal.onOneSecondTimer()  # a COMMIT record among the large entries
    journal.settle()
    commands.update(_fill_large(journal, 31, 60))  # ~4.2 MB in all: four sealed segments, a fifth written to
    fill(journal, 61, 64, size=300)  # small entries at the end
    journal.deleteEntriesFrom(len(journal) - 1)  # a truncation record
    sealed = journal.segment_paths[:-1]
    assert len(sealed) >= 3
    crash(journal)
    again = open_journal(path, segment_bytes=1024 * 1024, cache_bytes=0)
    total = sum(p.stat().st_size for p in again.segment_paths)
    assert entries(again) == [(index, 1 + index // 10) for index in range(1, 61)] + [(i, 1) for i in range(61, 64)]
    assert (again.getCurrentTerm(), again.getVotedForNodeId(), again.getRaftCommitIndex()) == (9, "b:2", 30)
    sealed_bytes = sum(p.stat().st_size for p in sealed)
    assert again.unread_at_open_bytes > 0.95 * sealed_bytes
    assert again.read_at_open_bytes < total - 0.9 * sealed_bytes
    assert [again[i][0] for i in range(60)] == [commands[index] for index in range(1, 61)]
    again.add(command(PLAIN_ID, b"after"), 64, 7)
    again._destroy()
    assert entries(open_journal(path, segment_bytes=1024 * 1024))[-2:] == [(63, 1), (64, 7)]


def test_damage_to_an_unread_command_fails_the_journal_when_it_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "raft.wal"
    journal = open_journal(path, segment_bytes=1024 * 1024, cache_bytes=0)
    _fill_large(journal, 1, 40)
    sealed = journal.segment_paths[0]
    damaged_at = journal._offsets[3] + 1000  # inside entry 4's command, in the first (sealed) segment
    assert journal._sequences[3] == journal._sequences[0]
    crash(journal)
    _flip(sealed, damaged_at)
    again = open_journal(path, segment_bytes=1024 * 1024, cache_bytes=0)  # not read at open
    assert len(again) == 40 and again.failure is None
    assert again[2][1] == 3  # its neighbours read back
    with pytest.raises(JournalError, match="the record of entry 4 .* is damaged"):
        again[3]
    assert again.failure is not None and again.sync_pending
    again._destroy()


@pytest.mark.parametrize("where", ["length", "index", "first index of a segment", "small record", "last entry"])
def test_damage_a_restart_still_finds_in_sealed_segments_is_refused(tmp_path: Path, where: str) -> None:
    """What the scan reads is checked: a record's length (the scan must end at the segment's end), an
    entry index out of order (the record is then read whole and its checksum fails; for a segment's
    first entry, against the previous segment's last), a small record, and the last entry of the log,
    which is read back at open whatever segment holds it."""
    path = tmp_path / "raft.wal"
    journal = open_journal(path, segment_bytes=1024 * 1024, cache_bytes=0)
    _fill_large(journal, 1, 20)
    fill(journal, 21, 22, size=300)
    _fill_large(journal, 23, 40)
    second = next(i for i, sequence in enumerate(journal._sequences) if sequence == 2)
    position = {"length": 5, "index": 5, "first index of a segment": second, "small record": 20,
                "last entry": 39}[where]
    offset, segment = journal._offsets[position], journal.segment_paths[journal._sequences[position] - 1]
    if where == "last entry":
        journal.deleteEntriesTo(0)  # keeps every entry...
        journal._seal()  # ...and ends its segment: the last entry is in a sealed segment
        assert journal._sequences[-1] < len(journal.segment_paths)
    at = offset + {"length": 1, "small record": 40, "last entry": 2000}.get(where, 9 + 1)
    assert segment != journal.segment_paths[-1]  # sealed
    crash(journal)
    _flip(segment, at)
    with pytest.raises(JournalError, match="corrupt record|damaged"):
        open_journal(path, segment_bytes=1024 * 1024, cache_bytes=0)
