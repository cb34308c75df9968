"""The ``SyncObj`` subclass behind :class:`broker.replication.raft.PysyncobjReplicator`.

Two ``@replicated`` methods (plain and synced) hand each committed ``bytes`` command to the
:class:`StateMachine` with its Raft index. The leader builds their entries itself, and every node
takes a large command back out of its entry itself (:func:`regular_entry`, :func:`entry_command`):
the same bytes as pysyncobj's, with the command copied once where pysyncobj copies it twice (its
pickling, then the type byte put in front; its slice, then its unpickling).

The node also: uses :class:`journal.DurableJournal` and holds messages back until it is synced
(``journal.SyncingTransport``), asks for pre-votes (``prevote.PreVoteMixin``), fails commands queued
on a non-leader instead of forwarding them, sends the commands queued in a tick together, leaves a
new commit index to its next AppendEntries (``commit_notice_delay_s``) instead of a commit-only
message after every apply, spreads and defers compactions, reads waiting messages before an
election, replays the log's membership changes after a restart, and halts after a failed snapshot restore.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from pysyncobj.journal import Journal
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic

from broker.replication import CommandPieces, Role, StateMachine, _patches, command_size
from broker.replication.journal import (
    CACHE_BYTES_DEFAULT,
    DIRECT_WRITE_MIN_BYTES_DEFAULT,
    JOURNAL_DIR_NAME,
    SEGMENT_BYTES_DEFAULT,
    DurableJournal,
    ReleasingPoller,
    SyncingTransport,
    fsync_path,
)
from broker.replication.prevote import PreVoteMixin
from broker.replication.snapshot import read_raft_data, snapshot_index
from broker.replication.snapshot_guard import SnapshotGuardMixin
from broker.replication.stats import RaftCounters
from broker.replication.transfer import LeadershipTransferMixin
from broker.replication.transport import GuardedTransport, HandshakeLimits
from broker.storage import ApplyHalt

logger = logging.getLogger(__name__)

_ROLES = {0: Role.FOLLOWER, 1: Role.CANDIDATE, 2: Role.LEADER}
_CANDIDATE_STATE, _LEADER_STATE = 1, 2
_LEADER_COMPACTION_DEFERRAL = 4
# A peer grants a pre-vote only if it has not heard from a leader for this share of the minimum
# election timeout: below 1 so that, after a leader dies, the first follower to time out is granted.
_PREVOTE_LEASE_SHARE = 0.75
_APPLY_METHOD = "_apply_command_v0"
_SYNCED_APPLY_METHOD = "_apply_synced_command_v0"
# An idle poll waits this much past a timer's due time: a poll that ended a little early (its timeout
# is rounded to milliseconds) would find the timer not yet due and wait a whole tick period more.
_POLL_SLACK_S = 0.001
_REGULAR, _NO_OP, _MEMBERSHIP, _VERSION = 0, 1, 2, 3  # pysyncobj's _COMMAND_TYPE values
# One pass of pysyncobj's apply reads at most this many bytes of commands (it would read every entry
# between its applied index and the commit index at once: after a restart, up to the whole journal).
_APPLY_READ_MAX_BYTES = 64 * 1024 * 1024


def _replicated_method_ids(cls: type) -> dict[str, int]:
    """The ids pysyncobj gives the replicated methods of ``cls`` (sorted by version, then name)."""
    names = [m for m in dir(cls) if getattr(getattr(cls, m), "replicated", False)
             and m != getattr(cls, m).origName]
    return {name: i for i, (_ver, name) in enumerate(sorted((getattr(cls, n).ver, n) for n in names))}


def command_needs_sync(command: bytes, synced_method_id: int) -> bool:
    """Whether a log entry must be fsynced before it is acknowledged: calls of the synced apply method
    and membership/version changes do; no-ops and plain applies do not. Reads the pysyncobj command
    header (type byte, pickle PROTO, optional FRAME, BININT1 method id); anything else is synced."""
    kind = command[0] if command else _REGULAR
    if kind == _NO_OP:
        return False
    if kind != _REGULAR:
        return True
    pos = 1
    if command[pos:pos + 1] == b"\x80":  # PROTO n
        pos += 2
    if command[pos:pos + 1] == b"\x95":  # FRAME <8-byte length>
        pos += 9
    if command[pos:pos + 1] != b"K":  # BININT1 <method id>
        return True
    return command[pos + 1] == synced_method_id


# A regular entry of a large command, as pysyncobj's @replicated wrapper writes it with protocol 5:
# the command type, then pickle.dumps((method_id, (command,))). From 64 KiB on, the pickler writes the
# command outside any frame: PROTO 5, BININT1 id, BINBYTES <u32 length>, the command, then one FRAME
# of the 6 closing bytes (MEMOIZE TUPLE1 MEMOIZE TUPLE2 MEMOIZE STOP).
_ENTRY_PLAIN_MIN_BYTES = 64 * 1024
_ENTRY_HEAD = struct.Struct("<4sBcI")  # type + PROTO 5 + BININT1 opcode, method id, BINBYTES, length
_ENTRY_START = bytes((_REGULAR,)) + b"\x80\x05K"
_ENTRY_END = b"\x95" + (6).to_bytes(8, "little") + b"\x94\x85\x94\x86\x94."


def regular_entry(method_id: int, command: bytes | CommandPieces) -> bytes:
    """The log entry pysyncobj's ``@replicated`` wrapper makes of ``method(command)``, byte for byte
    (``bytes((0,)) + pickle.dumps((method_id, (command,)))``), with the command copied once: the
    wrapper's pickling and its prefixing of the type byte copied a 1 MiB publish twice more on the
    leader's event loop. A command given as pieces is joined straight into the entry. Smaller
    commands (and pickle protocols other than 5) go the wrapper's way."""
    size = command_size(command)
    if size < _ENTRY_PLAIN_MIN_BYTES or _patches.pickle_protocol() != 5 or not 0 <= method_id < 256:
        whole = command.joined() if isinstance(command, CommandPieces) else command
        return bytes((_REGULAR,)) + pysyncobj_pickle.dumps((method_id, (whole,)))
    pieces = command.pieces if isinstance(command, CommandPieces) else (command,)
    return b"".join((_ENTRY_HEAD.pack(_ENTRY_START, method_id, b"B", size), *pieces, _ENTRY_END))


def entry_command(entry: bytes, method_ids: tuple[int, ...]) -> memoryview | None:
    """The command of an entry shaped as :func:`regular_entry` shapes a large one, calling one of
    ``method_ids``, as a view of the entry (not copied: the state machine parses it where it lies);
    None for any other entry (pysyncobj's own apply then unpickles it: two copies of the command)."""
    if len(entry) < _ENTRY_HEAD.size + _ENTRY_PLAIN_MIN_BYTES + len(_ENTRY_END):
        return None
    start, method_id, opcode, length = _ENTRY_HEAD.unpack_from(entry)
    if start != _ENTRY_START or opcode != b"B" or method_id not in method_ids \
            or len(entry) != _ENTRY_HEAD.size + length + len(_ENTRY_END) or not entry.endswith(_ENTRY_END):
        return None
    return memoryview(entry)[_ENTRY_HEAD.size:_ENTRY_HEAD.size + length]


def _discard_state_ahead_of_log(state_machine: StateMachine, last_index: int, dump_file: Path) -> None:
    """At start: a state machine past both the journal's last entry and the snapshot's index holds
    applies of entries this node no longer has. Applies are made durable without waiting for the
    journal's fsync (only flagged commands wait), so a power loss can drop journal entries whose
    applies the store had flushed. Those entries may be lost on every node, and a new leader then
    puts other commands at their indexes: the state machine would skip them as already applied,
    acknowledged writes included. So the state is discarded and rebuilt from the snapshot and the
    journal (or from the leader), as for a store deleted by hand."""
    applied = state_machine.applied_index()
    if applied <= last_index:
        return
    snapshot_at = 0
    if dump_file.is_file():
        try:
            snapshot_at = snapshot_index(read_raft_data(str(dump_file)))
        except Exception:  # noqa: BLE001 - loading the dump reports it; keep the state meanwhile
            logger.warning("cannot read the snapshot %s to compare with the applied index", dump_file, exc_info=True)
            return
    if applied <= snapshot_at:
        return
    logger.warning("the state machine is at index %d, past the journal's last entry (%d) and the snapshot (%d): "
                   "a power loss dropped journal entries it had applied; discarding the state to rebuild it "
                   "from the snapshot and the journal", applied, last_index, snapshot_at)
    state_machine.discard_state()


def keep_entries_after_snapshot(log: Journal, before: tuple[Any, ...], last: tuple[Any, ...]) -> bool:
    """At start, before pysyncobj loads its own snapshot: make a log that holds the snapshot's last
    two entries begin with them, so that the entries after them are kept. True when it did.

    pysyncobj keeps its log on load only if its first two entries are the snapshot's (the entry
    before the last applied one, and that one), and otherwise clears it to those two. A log
    compaction writes the snapshot first (fsynced, the journal's barrier) and the journal's COMPACT
    record after it, unsynced, behind any entries appended while the snapshot was written. A crash
    that loses that record (a power loss, which keeps only what was fsynced) leaves a log that
    begins before the snapshot, and the clear then threw away entries after it that were fsynced
    and acknowledged (``fsync`` topics lost acknowledged batches in the power-loss drill, 2026-12-05).
    Raft keeps them (the paper, section 7: an existing entry with the snapshot's last index and term
    keeps the entries that follow it). Entries are compared by index and term, which by Raft's log
    matching property identify them. A log that does not hold both (it ends before the snapshot, or
    holds other terms there) is left alone, and pysyncobj clears it as before."""
    if len(log) < 2:
        return False
    first = log[0][1]
    position = before[1] - first
    if position <= 0 or position + 1 >= len(log) or last[1] != before[1] + 1:
        return False
    held_before, held_last = log[position], log[position + 1]
    if (held_before[1], held_before[2]) != (before[1], before[2]) or (held_last[1], held_last[2]) != (last[1], last[2]):
        return False
    log.deleteEntriesTo(position)
    return True


@dataclass(frozen=True)
class Restore:
    """A copy of another cluster's member, started alone as a new cluster (``broker.data_dir``:
    adopted). Its snapshot and journal name the old members, who are not there: counted, they would
    leave it without a majority for good. So the history's membership is not counted:
    ``history_end(journal's last index)`` gives the last index of that history (recorded at the first
    such start), and ``done()`` is called once a snapshot of this node's own holds the new
    configuration (the history's entries are then compacted away)."""

    history_end: Callable[[int], int]
    done: Callable[[], None]


class _RaftNode(PreVoteMixin, SnapshotGuardMixin, LeadershipTransferMixin, SyncObj):
    """The SyncObj: two replicated methods (plain and synced), no forwarding to the leader, PreVote,
    our journal with its send gate, refuses stale snapshots, halts on a failed restore."""

    _METHOD_IDS = {}  # type: dict[str, int]  # filled below the class
    _reading_for_apply = False  # pysyncobj's apply is reading entries (_SyncObj__getEntries)

    def __init__(self, self_address: str, peer_addresses: list[str], conf: SyncObjConf,
                 state_machine: StateMachine, compaction_max_log_bytes: int, *, journal_sync: str = "flagged",
                 pre_vote: bool | None = None, simulate_power_loss: bool = False,
                 stale_snapshot_guard: bool | None = None, counters: RaftCounters | None = None,
                 handshake_limits: HandshakeLimits | None = None, commit_notice_delay_s: float = 0.0,
                 idle_poll_max_s: float = 0.0, journal_segment_bytes: int = SEGMENT_BYTES_DEFAULT,
                 journal_cache_bytes: int = CACHE_BYTES_DEFAULT,
                 journal_direct_write_min_bytes: int = DIRECT_WRITE_MIN_BYTES_DEFAULT,
                 restore: Restore | None = None) -> None:
        # Set before SyncObj.__init__: its tick thread may apply entries at once, and its transport
        # (GuardedTransport) reads handshake_limits when it is built.
        self.handshake_limits = handshake_limits or HandshakeLimits()
        self._restore = restore  # a restored copy's first start(s): see Restore
        self._history_end = 0  # with _restore: the copy's last index; membership up to it is not counted
        self._restore_compaction_asked = False
        self._state_machine = state_machine
        self._compaction_max_log_bytes = compaction_max_log_bytes
        self._compaction_bytes_trigger = compaction_max_log_bytes
        self._applied_bytes_since_compaction = 0
        # log compactions the byte trigger asked for (diagnostics, tests); triggers that come while a
        # snapshot is being taken make one more take, not one each
        self.compactions_triggered = 0
        self.halted = False
        self.halt_reason: BaseException | None = None  # why apply halted the node (status reports it)
        self.counters = counters or RaftCounters()  # elections here; fsyncs in the journal (metrics)
        self._configuration_replayed = False
        self._term_first_index = 0  # as leader: the index of its term's no-op (status_fields)
        self._coalescing_sends = False  # _checkCommandsToApply: one send for the commands it appends
        self._commit_notice_delay_s = commit_notice_delay_s  # RaftOptions.commit_notice_delay_s
        self._commit_notice_at: float | None = None  # leader: when to send followers a commit not yet sent
        self._idle_poll_max_s = idle_poll_max_s  # RaftOptions.idle_poll_max_s (0: pysyncobj's fixed period)
        self._init_transfer()
        active = _patches.active_patches()
        self._init_prevote("prevote" in active if pre_vote is None else pre_vote,
                           conf.raftMinTimeout * _PREVOTE_LEASE_SHARE)
        synced_id = self._METHOD_IDS[_SYNCED_APPLY_METHOD]
        self._apply_method_ids = (self._METHOD_IDS[_APPLY_METHOD], synced_id)  # entry_command's
        dump_file = Path(conf.fullDumpFile)
        self._init_snapshot_guard("stale_snapshot" in active if stale_snapshot_guard is None else stale_snapshot_guard,
                                  dump_file, read_raft_data)

        def snapshot_barrier() -> None:  # the snapshot replacing a dropped prefix is durable first
            fsync_path(dump_file)
            fsync_path(dump_file.parent)

        if conf.bindAddress is None:  # pysyncobj would bind 0.0.0.0 (every interface) with the port
            conf.bindAddress = self_address
        journal_path = str(conf.journalFile)

        def open_journal() -> DurableJournal:  # pysyncobj calls it in SyncObj.__init__, before any apply
            journal = DurableJournal(
                Path(journal_path).with_name(JOURNAL_DIR_NAME), legacy_file=Path(journal_path),
                segment_bytes=journal_segment_bytes, needs_sync=lambda command: command_needs_sync(command, synced_id),
                sync_entries=journal_sync if "journal_sync" in active else "never",
                snapshot_barrier=snapshot_barrier, simulate_power_loss=simulate_power_loss,
                fsync_latency=self.counters.fsync, cache_bytes=journal_cache_bytes,
                direct_write_min_bytes=journal_direct_write_min_bytes,
                on_truncate=state_machine.journal_truncated)
            last_index = journal[-1][1] if len(journal) else 0
            if self._restore is not None:
                self._history_end = self._restore.history_end(last_index)
            _discard_state_ahead_of_log(state_machine, last_index, dump_file)
            state_machine.journal_opened(last_index)
            return journal

        _patches.register_journal(journal_path, open_journal)
        # Nodes reach the same entry count and applied bytes together; spread their compactions (each
        # stalls its tick thread while the state machine snapshots, then packs the whole store beside
        # the node's work) so that the nodes do not all pause and pack at once.
        spread = 1.0 + (zlib.crc32(self_address.encode()) % 1000) / 2000
        self._compaction_max_log_bytes = int(compaction_max_log_bytes * spread)
        self._compaction_bytes_trigger = self._compaction_max_log_bytes  # x _LEADER_COMPACTION_DEFERRAL as leader
        self._compaction_min_entries = max(2, int(conf.logCompactionMinEntries * spread))
        self._compaction_min_time_s = conf.logCompactionMinTime * spread
        conf.logCompactionMinEntries = self._compaction_min_entries
        conf.logCompactionMinTime = self._compaction_min_time_s
        try:
            super().__init__(self_address, peer_addresses, conf, transportClass=GuardedTransport)
        finally:
            _patches.forget_journal(journal_path)
        assert self._methodToID[_SYNCED_APPLY_METHOD] == synced_id, "pysyncobj numbers methods differently"
        assert self._methodToID[_APPLY_METHOD] == self._apply_method_ids[0], "pysyncobj numbers methods differently"

    # pysyncobj assigns self._poller in SyncObj.__init__; every poll releases held messages around it,
    # and an idle node's poll waits longer (_poll_wait_s).
    @property
    def _poller(self) -> ReleasingPoller:
        poller: ReleasingPoller = self.__dict__["_releasing_poller"]
        return poller

    @_poller.setter
    def _poller(self, poller: object) -> None:
        self.__dict__["_releasing_poller"] = ReleasingPoller(poller, self.release_held_messages, self._poll_wait_s)

    def _poll_wait_s(self, period_s: float) -> float:
        """Tick thread, as a tick ends: how long its poll may wait for a message.

        pysyncobj waits ``auto_tick_period_s`` (10 ms) whatever the node is doing, so an idle node
        woke about 110 times a second, at ~250 us of CPU per wake-up here (3.5-4 % of a core per
        node). When nothing is under way (:meth:`_idle`), wait instead until the next timer is due,
        at most ``idle_poll_max_s``: a leader's heartbeat (``append_entries_period_s``) or commit
        notice, a follower's election deadline. What ends a poll at once is unchanged: a Raft
        message, a command submitted on any thread (pysyncobj's pipe notifier), and :meth:`wake`,
        which every other request to this thread uses. The timers not counted here (reconnects,
        the leader's step-down without a majority, unnamed connections' timeout, compaction by
        time) run on a scale of seconds and may start up to ``idle_poll_max_s`` late."""
        cap = self._idle_poll_max_s
        if cap <= period_s or not self._idle():
            return period_s
        if self._SyncObj__raftState == _LEADER_STATE:
            due: float = self._SyncObj__newAppendEntriesTime
            notice_at = self._commit_notice_at
            if notice_at is not None:
                due = min(due, notice_at)
        else:
            due = self._SyncObj__raftElectionDeadline
        return min(cap, max(period_s, due - pysyncobj_monotonic() + _POLL_SLACK_S))

    def _idle(self) -> bool:
        """Nothing for a tick to do before a message or a timer: the transport is up, this node is a
        leader or a follower that has applied what it knows is committed, no command is queued, no
        snapshot is being written or forced, no leadership transfer is under way, and as leader
        every follower holds the whole log (catching one up is driven by ticks)."""
        if self.__dict__.get("_SyncObj__pipeNotifier") is None or self.halted:
            return False  # batch mode: commands wait for the tick
        if not self._SyncObj__transport.ready or not self._SyncObj__onReadyCalled:
            return False
        state = self._SyncObj__raftState
        if state == _CANDIDATE_STATE or self.transferring or self.raftCommitIndex > self.raftLastApplied:
            return False
        if self._SyncObj__commandsQueue._FastQueue__queue or self._SyncObj__forceLogCompaction:
            return False
        if self._SyncObj__serializer._Serializer__pid != 0:  # a snapshot is being written
            return False
        if state == _LEADER_STATE:
            last = self._SyncObj__getCurrentLogIndex()
            return all(match >= last for match in self._SyncObj__raftMatchIndex.values())
        return True

    def wake(self) -> None:
        """Any thread: end the tick thread's poll now, so that what was asked of it runs at once."""
        notifier = self.__dict__.get("_SyncObj__pipeNotifier")
        if notifier is not None:
            with contextlib.suppress(BlockingIOError):  # the pipe is full: a wake-up is already pending
                notifier.notify()

    def forceLogCompaction(self) -> None:  # noqa: N802 (pysyncobj's name)
        super().forceLogCompaction()
        self.wake()

    def destroy(self) -> None:
        super().destroy()
        self.wake()

    def release_held_messages(self) -> None:
        """fsync the journal if needed and send what the transport held back (replication thread)."""
        transport = self.__dict__.get("_SyncObj__transport")
        if isinstance(transport, SyncingTransport):
            transport.release()

    @property
    def journal(self) -> DurableJournal | None:
        journal = self.__dict__.get("_SyncObj__raftLog")
        return journal if isinstance(journal, DurableJournal) else None

    def _SyncObj__applyLogEntries(self) -> bool:
        # Applying leads to acknowledgements; nothing is applied before it is synced (a single node
        # never sends, so this is where its entries are synced).
        journal = self.journal
        if journal is not None and self.raftCommitIndex > self.raftLastApplied:
            if journal.sync_pending:
                self.release_held_messages()
            self._pass_entries_applied_before(journal)
        self._reading_for_apply = True
        try:
            need_send = bool(super()._SyncObj__applyLogEntries())
        finally:
            self._reading_for_apply = False
        if need_send and self._commit_notice_delay_s > 0 and self._SyncObj__raftState == _LEADER_STATE:
            # pysyncobj would send every follower a commit-only AppendEntries now, and each would answer
            # it. The next AppendEntries carries the commit index anyway; send one only if none has
            # gone out by then (_onTick).
            if self._commit_notice_at is None:
                self._commit_notice_at = pysyncobj_monotonic() + self._commit_notice_delay_s
            return False
        return need_send

    def _SyncObj__getEntries(self, fromIDx: int | None, count: int | None = None,  # noqa: N802, N803
                             maxSizeBytes: int | None = None) -> list[tuple[bytes, int, int]]:  # noqa: N803
        # pysyncobj slices the whole log from fromIDx before it cuts at maxSizeBytes: the journal reads
        # back only what it returns (a follower far behind is sent entries from the segments).
        log = self._SyncObj__raftLog
        if fromIDx is None or not isinstance(log, DurableJournal):
            result: list[tuple[bytes, int, int]] = super()._SyncObj__getEntries(fromIDx, count, maxSizeBytes)
            return result
        if self._reading_for_apply and maxSizeBytes is None:
            maxSizeBytes = _APPLY_READ_MAX_BYTES  # the rest is applied at the next tick
        return log.entries_from(fromIDx, count, maxSizeBytes)

    def _pass_entries_applied_before(self, journal: DurableJournal) -> None:
        """After a restart pysyncobj applies from its snapshot's index, while the store holds the
        applies up to its own applied index (it skips them). A 3-node leader keeps up to 1.5 GiB of
        journal past its snapshot, and pysyncobj reads it back whole to hand it to the state machine
        for nothing, all of it in memory at once (a leader with 566-760 MiB of journal peaked at
        738-957 MB of RSS, against 149-154 MB now; bench/NOTE.md 2026-12-04). So move pysyncobj's
        applied index past the regular and no-op entries the state machine has applied, from the
        journal's in-memory command types and lengths, without reading a command. Membership entries
        were replayed at start
        (:meth:`_replay_log_configuration`) and a code version entry changes pysyncobj's state, so the
        pass stops before either and pysyncobj applies it. Counted toward the byte trigger of
        compaction as if applied, as they were before."""
        last = self.raftLastApplied
        target = min(self.raftCommitIndex, self._state_machine.applied_index())
        if target <= last or self._SyncObj__commandsWaitingCommit:
            return
        kinds = journal.command_kinds(last + 1, target + 1)
        if len(kinds) != target - last:
            return  # not all held (cannot happen after a restart: pysyncobj reads what it applies)
        stop = len(kinds)
        for kind in (_MEMBERSHIP, _VERSION):
            found = kinds.find(kind)
            if 0 <= found < stop:
                stop = found
        if stop == 0:
            return
        self._SyncObj__raftLastApplied = last + stop
        self._count_applied_bytes(journal.command_bytes(last + 1, last + stop + 1))

    def _SyncObj__setState(self, newState: int) -> None:
        if newState == _LEADER_STATE:  # __onBecomeLeader appends its no-op right after this call
            self._term_first_index = self._SyncObj__getCurrentLogIndex() + 1
        super()._SyncObj__setState(newState)
        if newState == _CANDIDATE_STATE:
            self.counters.elections_started += 1
        elif newState == _LEADER_STATE:
            self.counters.elections_won += 1
        # A leader that pauses longer than the election timeout is deposed: it compacts 4x less often,
        # by each trigger (the byte trigger is the one that fires under heavy writes). A lone node has
        # no one to depose it, and a longer journal only slows its restart, which reads it all back
        # (bench disk-1 restart after 3M records: 7-9 s deferred, 1.5 s not; bench/NOTE.md 2026-12-03).
        # Its deferral is decided when it becomes leader: a node added later changes it at the next
        # election.
        lone = not self._SyncObj__otherNodes
        deferral = _LEADER_COMPACTION_DEFERRAL if newState == _LEADER_STATE and not lone else 1
        self.conf.logCompactionMinEntries = self._compaction_min_entries * deferral
        self.conf.logCompactionMinTime = self._compaction_min_time_s * deferral
        self._compaction_bytes_trigger = self._compaction_max_log_bytes * deferral

    def _onTick(self, timeToWait: float = 0.0) -> None:
        if not self._configuration_replayed and self._SyncObj__needLoadDumpFile \
                and not os.path.isfile(self.conf.fullDumpFile):
            self._replay_log_configuration()  # with a snapshot, _SyncObj__loadDumpFile does it
        # pysyncobj checks the election deadline before reading the socket: a follower whose tick
        # stalled (long apply or snapshot) would depose a live leader whose heartbeats are waiting.
        if self._SyncObj__raftState != _LEADER_STATE and self._SyncObj__raftElectionDeadline < pysyncobj_monotonic():
            self._poller.poll(0)
        self._advance_transfer()
        super()._onTick(timeToWait)
        if self._restore is not None:
            self._advance_restore()
        notice_at = self._commit_notice_at
        if notice_at is not None and pysyncobj_monotonic() >= notice_at:
            self._commit_notice_at = None
            if self._SyncObj__raftState == _LEADER_STATE:
                self._SyncObj__sendAppendEntries()

    def _advance_restore(self) -> None:
        """A restored copy, leading alone: once it has applied past the copy's history, take a
        snapshot (it holds the new configuration and drops the history's entries); once that is
        written, the restore is done."""
        serialized = self._SyncObj__lastSerializedEntry
        if self._restore_compaction_asked and serialized is not None and serialized >= self._history_end:
            restore, self._restore = self._restore, None
            assert restore is not None
            logger.info("restored copy: a snapshot at index %d holds this node's own configuration; its old "
                        "members are gone for good", serialized)
            restore.done()
            return
        if not self._restore_compaction_asked and self._SyncObj__raftState == _LEADER_STATE \
                and self.raftLastApplied > self._history_end:
            self._restore_compaction_asked = True
            self.forceLogCompaction()

    def _replay_log_configuration(self) -> None:
        """Raft uses the latest configuration in its log, committed or not. pysyncobj changes its
        configuration when it appends a membership entry, but after a restart only when it applies
        one: a node restarted before applying the entries after its snapshot would count votes and
        commits in an older configuration. Apply those changes now (applying them again later is a
        no-op in pysyncobj)."""
        self._configuration_replayed = True
        log = self._SyncObj__raftLog
        if not len(log):
            return
        start = max(self.raftLastApplied + 1, log[0][1])
        if self._restore is not None:  # a restored copy: the history's changes name the old members
            start = max(start, self._history_end + 1)
        journal = self.journal
        if journal is None:
            commands = [command for command, _index, _term in self._SyncObj__getEntries(start)]
        else:  # only the membership entries are read back, found by their command type in memory
            kinds = journal.command_kinds(start, self._SyncObj__getCurrentLogIndex() + 1)
            commands, at = [], kinds.find(_MEMBERSHIP)
            while at >= 0:
                commands.append(journal.entries_from(start + at, 1)[0][0])
                at = kinds.find(_MEMBERSHIP, at + 1)
        for command in commands:
            request = self._SyncObj__parseChangeClusterRequest(command)
            if request is not None:
                self._SyncObj__doChangeCluster(request)

    def halt(self, reason: BaseException | None = None) -> None:
        """Stop for good without another word to the leader (after a failed snapshot restore, or an
        apply that must not go on: ``reason``, which the replicator's status reports)."""
        self.halted = True
        if reason is not None and self.halt_reason is None:
            self.halt_reason = reason
        self.destroy()

    def _SyncObj__sendNextNodeIdx(self, node: object, reset: bool = False, nextNodeIdx: int | None = None,
                                  success: bool = False) -> None:
        if self.halted:  # do not acknowledge a snapshot that could not be restored
            return
        super()._SyncObj__sendNextNodeIdx(node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        if not clearJournal:  # this node's own snapshot, at start (an installed one replaces the log)
            self._keep_entries_after_snapshot()
        super()._SyncObj__loadDumpFile(clearJournal)
        if self._restore is not None and not clearJournal:  # a restored copy: its old members are not here
            self._SyncObj__updateClusterConfiguration([])
        self._replay_log_configuration()  # the snapshot's configuration, then the log's changes
        # Restoring a large snapshot can outlast the election timeout that the leader's message
        # just reset; count the leader as heard from now, or this follower would depose it.
        self._SyncObj__raftElectionDeadline = pysyncobj_monotonic() + self._SyncObj__generateRaftTimeout()

    def _keep_entries_after_snapshot(self) -> None:
        """:func:`keep_entries_after_snapshot` for the snapshot in place (pysyncobj reads the same
        file next; one it cannot read is reported by its load)."""
        try:
            last, before = read_raft_data(self.conf.fullDumpFile)[:2]
        except Exception:  # noqa: BLE001 - pysyncobj's load reports an unreadable snapshot
            return
        if not (isinstance(last, tuple) and isinstance(before, tuple) and len(before) == 3):
            return
        log = self._SyncObj__raftLog
        dropped = before[1] - log[0][1] if len(log) else 0
        if keep_entries_after_snapshot(log, before, last):
            logger.warning("the log began %d entries before its snapshot at index %d (its compaction was not "
                           "synced before a crash): dropped them, kept the %d entries after the snapshot",
                           dropped, last[1], len(log) - 2)

    @replicated
    def _apply_command(self, command: bytes) -> object:
        return self._apply(command)

    @replicated
    def _apply_synced_command(self, command: bytes) -> object:
        """The same, for commands whose entry is fsynced before it is acknowledged (``sync=True``)."""
        return self._apply(command)

    def submit_command(self, command: bytes | CommandPieces, callback: Callable[[object, int], None], *,
                       sync: bool) -> None:
        """Queue ``command`` for the leader's next tick, as ``_apply_command(command, callback=...)``
        (or the synced method) would, with the entry built by :func:`regular_entry`."""
        method_id = self._apply_method_ids[1 if sync else 0]
        self._applyCommand(regular_entry(method_id, command), callback)  # no type given: the entry has it

    def _SyncObj__doApplyCommand(self, command: bytes) -> object:  # noqa: N802 (pysyncobj's name)
        """A large command of ours goes to :meth:`_apply` without pysyncobj's slice and unpickling (a
        view of the entry instead of two copies); every other entry, pysyncobj's way."""
        ours = entry_command(command, self._apply_method_ids)
        if ours is not None:
            return self._apply(ours)
        if self._restore is not None and self.raftLastApplied < self._history_end and \
                self._SyncObj__parseChangeClusterRequest(command) is not None:
            return None  # a restored copy: a membership change of the old cluster (see Restore)
        return super()._SyncObj__doApplyCommand(command)

    def _apply(self, command: bytes | memoryview) -> object:
        # pysyncobj applies entry raftLastApplied + 1 and increments after this returns; an exception
        # here makes the next tick retry the same index (the state machine skips what it has).
        # The state machine raises only an ApplyHalt (it records any other failure as a result): a
        # storage failure, after which the node cannot know what it wrote, or a command its code
        # cannot apply. Either way it halts for good instead of diverging.
        try:
            result = self._state_machine.apply(self.raftLastApplied + 1, command)
        except ApplyHalt as exc:
            logger.critical("cannot apply index %d (%s): halting this node", self.raftLastApplied + 1, exc)
            self.halt(exc)
            raise
        self._count_applied_bytes(len(command))
        return result

    def _count_applied_bytes(self, count: int) -> None:
        self._applied_bytes_since_compaction += count
        if self._applied_bytes_since_compaction >= self._compaction_bytes_trigger:
            self._applied_bytes_since_compaction = 0
            self.compactions_triggered += 1
            self.forceLogCompaction()

    def _checkCommandsToApply(self) -> None:
        """Append queued commands when leader; otherwise, or while a leadership transfer holds writes,
        fail them (stock pysyncobj forwards them)."""
        if self._isLeader() and not self.transferring:
            appended_after = self._SyncObj__getCurrentLogIndex()
            # pysyncobj (appendEntriesUseBatch off) sends to every follower after each command it
            # appends: N commands queued since the last tick went out as N messages per follower, each
            # received, journaled and answered on its own. Send once, after the last of them: the
            # followers get them together (up to appendEntriesBatchSizeBytes per message), as soon.
            self._coalescing_sends = True
            try:
                super()._checkCommandsToApply()
            finally:
                self._coalescing_sends = False
            if self._SyncObj__getCurrentLogIndex() > appended_after:
                self._SyncObj__sendAppendEntries()
                if self._advance_leader_commit():
                    # A lone leader is its own majority: commit and apply now (the apply syncs the
                    # journal first, see _SyncObj__applyLogEntries) instead of at the next tick.
                    self._SyncObj__applyLogEntries()
            return
        known = self._getLeader() is not None or self.transferring
        reason = FAIL_REASON.NOT_LEADER if known else FAIL_REASON.MISSING_LEADER
        commands = self._SyncObj__commandsQueue
        for _ in range(self.conf.commandsQueueSize):
            try:
                _command, callback = commands.get_nowait()
            except queue.Empty:
                return
            self._SyncObj__callErrCallback(reason, callback)

    def _SyncObj__sendAppendEntries(self) -> None:
        if self._coalescing_sends:  # _checkCommandsToApply sends once when it has appended them all
            return
        self._commit_notice_at = None  # every follower gets this message, and it carries the commit index
        super()._SyncObj__sendAppendEntries()

    def _advance_leader_commit(self) -> bool:
        """Leader, right after appending: pysyncobj's commit rule (an entry of the current term held by
        a majority, counting this node) as at the start of ``_onTick``. Only a lone leader can gain a
        commit here (followers' acknowledgements arrive in the poll, and the next tick counts them).
        True when the commit index moved."""
        commit: int = self.raftCommitIndex
        last = self._SyncObj__getCurrentLogIndex()
        others = self._SyncObj__otherNodes
        match = self._SyncObj__raftMatchIndex
        majority = (len(others) + 1) / 2
        new_commit = commit
        index = commit
        while index < last:
            index += 1
            if 1 + sum(1 for node in others if match[node] >= index) <= majority:
                break
            entries = self._SyncObj__getEntries(index, 1)
            if entries and entries[0][2] == self._SyncObj__raftCurrentTerm:
                new_commit = index
        if new_commit == commit:
            return False
        self._SyncObj__raftCommitIndex = new_commit
        self._SyncObj__raftLog.setRaftCommitIndex(new_commit)
        self._SyncObj__leaderCommitIndex = new_commit
        return True

    def status_fields(self, has_quorum: bool) -> tuple[Role, int, int, int, str | None, bool, bool]:
        """(role, term, commit index, last applied, leader address, has quorum, leader ready) from any
        thread: each is one attribute read of a value the tick thread replaces atomically. Leader
        ready: not leader, or its term's first entry (pysyncobj's no-op) is applied."""
        applied = self.raftLastApplied  # before the commit index, which is never below it
        state = self._SyncObj__raftState
        first_of_term = self._term_first_index  # set before the state turns leader (_SyncObj__setState)
        leader = self._getLeader()
        return (
            _ROLES[state],
            self.raftCurrentTerm,
            max(self.raftCommitIndex, applied),
            applied,
            None if leader is None else str(leader.id),
            has_quorum,
            state != _LEADER_STATE or applied >= first_of_term,
        )

    def log_entry_size_bytes(self, index: int) -> int | None:
        """Size of the stored (and sent) entry at Raft ``index``, or None when not in the log."""
        log = self._SyncObj__raftLog
        if isinstance(log, DurableJournal):
            return log.entry_bytes(index)
        try:
            first = log[0][1]
            entry = log[index - first] if index >= first else None
        except IndexError:
            return None
        if entry is None or entry[1] != index:
            return None
        return len(entry[0])


_RaftNode._METHOD_IDS = _replicated_method_ids(_RaftNode)
