"""The pysyncobj implementation of :class:`broker.replication.Replicator` (and its Membership power).

The ``SyncObj`` subclass is in ``raft_node.py``; this module holds the options, the failure mapping
and :class:`PysyncobjReplicator`. Importing it applies the pinned pysyncobj patches (see
``_patches.py``; ``RAFTBROKER_PYSYNCOBJ_PATCHES_OFF`` switches them, PreVote and the journal's entry
syncs off for tests).

Threads: pysyncobj's tick thread does all the work (network, append, fsync, apply, callbacks,
snapshots). ``submit``/``status``/``transfer_leadership``/``force_compaction``/membership changes
may be called from any thread; work that must touch pysyncobj's state is handed to the tick thread.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pysyncobj import FAIL_REASON, SERIALIZER_STATE, SyncObjConf
from pysyncobj.monotonic import monotonic as pysyncobj_monotonic

from broker.replication import (
    Callback,
    CommandPieces,
    FailReason,
    ReplicaStatus,
    ReplicationError,
    Role,
    StateMachine,
    _patches,
    command_size,
)
from broker.replication.journal import CACHE_BYTES_DEFAULT, DIRECT_WRITE_MIN_BYTES_DEFAULT, SEGMENT_BYTES_DEFAULT
from broker.replication.raft_node import _APPLY_METHOD, _SYNCED_APPLY_METHOD, Restore, _RaftNode, command_needs_sync
from broker.replication.snapshot import PackState, SnapshotCodec
from broker.replication.stats import LeadershipTracker, RaftCounters, RaftStats
from broker.replication.transport import HandshakeLimits, salted_password, set_message_compression

__all__ = ["PysyncobjReplicator", "RaftOptions", "Restore", "command_needs_sync", "map_fail_reason", "_APPLY_METHOD",
           "_SYNCED_APPLY_METHOD", "_RaftNode"]

logger = logging.getLogger(__name__)

_patches.apply_patches_from_env()

# pysyncobj's journalFile: the key _patches builds our journal under, and the single-file journal of earlier
# releases, which journal.DurableJournal adopts as the first segment of its directory (journal.JOURNAL_DIR_NAME)
JOURNAL_FILE_NAME = "raft.journal"
ENV_SIMULATE_POWER_LOSS = "RAFTBROKER_SIMULATE_POWER_LOSS"
ENV_JOURNAL_SYNC = "RAFTBROKER_JOURNAL_SYNC"
DUMP_FILE_NAME = "raft.snapshot"
SNAPSHOT_WORK_DIR_NAME = "snapshot-work"
_TRANSFER_WAIT_S = 1.0
_CLOSE_JOIN_S = 5.0
_SERIALIZER_STATES = {
    PackState.IDLE: SERIALIZER_STATE.NOT_SERIALIZING,
    PackState.RUNNING: SERIALIZER_STATE.SERIALIZING,
    PackState.SUCCEEDED: SERIALIZER_STATE.SUCCESS,
    PackState.FAILED: SERIALIZER_STATE.FAILED,
}

# pysyncobj's FAIL_REASON -> ours. LEADER_CHANGED and UNKNOWN_OUTCOME only concern forwarded
# commands (we never forward): the command may or may not be applied, which is TIMEOUT's meaning.
_FAIL_REASONS = {
    FAIL_REASON.QUEUE_FULL: FailReason.QUEUE_FULL,
    FAIL_REASON.MISSING_LEADER: FailReason.NO_LEADER,
    FAIL_REASON.DISCARDED: FailReason.DISCARDED,
    FAIL_REASON.NOT_LEADER: FailReason.NOT_LEADER,
    FAIL_REASON.LEADER_CHANGED: FailReason.TIMEOUT,
    FAIL_REASON.REQUEST_DENIED: FailReason.DISCARDED,
    FAIL_REASON.UNKNOWN_OUTCOME: FailReason.TIMEOUT,
}


def map_fail_reason(code: int) -> FailReason:
    """Our :class:`FailReason` for a pysyncobj ``FAIL_REASON`` code other than SUCCESS."""
    assert code != FAIL_REASON.SUCCESS
    return _FAIL_REASONS.get(code, FailReason.TIMEOUT)


APPEND_ENTRIES_BATCH_BYTES_MAX = 16 * 1024 * 1024
_ENTRY_FRAMING_BYTES = 64 * 1024  # above a command's length: pysyncobj's pickled (method, args) wrapper


@dataclass(frozen=True)
class RaftOptions:
    """Tunables of :class:`PysyncobjReplicator` (defaults measured on a 2-core machine, see the design
    note). Timeouts in seconds, sizes in bytes."""

    raft_min_timeout_s: float = 0.4  # election timeout range; must exceed 3 x append period
    raft_max_timeout_s: float = 0.8
    append_entries_period_s: float = 0.05  # heartbeat period (and batch-send period in batch mode)
    auto_tick_period_s: float = 0.01  # tick thread's poll timeout; bounds commit latency in batch mode
    append_entries_use_batch: bool = False  # False: send each command at once (~1 ms vs ~11 ms idle)
    # After the leader commits, followers learn the new commit index from the next AppendEntries it
    # sends (the next command's, or a heartbeat), or this long after the commit at the latest (then
    # within one auto_tick_period_s). 0: at once, as pysyncobj does: one commit-only AppendEntries per
    # follower after every apply, each answered, so a lone request cost 8 Raft messages instead of 4
    # (closed loop of 1-record publishes, one sender: 8 % less leader and 14 % less follower CPU per
    # request, bench/NOTE.md 2026-11-29 14:00 UTC). What waits is only the followers' apply; the
    # leader's commit and answer do not.
    commit_notice_delay_s: float = 0.01
    # An idle node's tick thread polls until its next timer is due (a leader's heartbeat, a follower's
    # election deadline), at most this long, instead of every auto_tick_period_s: idle, a node woke
    # ~110 times a second at ~250 us of CPU each (_RaftNode._poll_wait_s). Messages, submitted commands
    # and requests to the tick thread end the wait at once. auto_tick_period_s: pysyncobj's fixed period.
    idle_poll_max_s: float = 0.1
    # Bytes of entries per AppendEntries message (pysyncobj's appendEntriesBatchSizeBytes). A command at
    # least this long is sent as a chunked "transmission" instead: one message and one reply per chunk,
    # and a follower that re-joins the chunks one bytes concatenation at a time (quadratic). At 64 KiB
    # (pysyncobj's default) a 1000 x 1 KiB publish crossed as ~16 chunks per follower. None: just
    # above max_command_bytes, so no command is chunked (node CPU per 1 KiB record -16 %, bench/NOTE.md,
    # 2026-11-28 09:20 UTC), at most APPEND_ENTRIES_BATCH_BYTES_MAX (a message then stays below twice
    # that, far inside the transport's frame limit).
    append_entries_batch_bytes: int | None = None
    compaction_min_entries: int = 20_000  # compact when the log holds more entries than this...
    compaction_min_time_s: float = 300.0  # ...or this long after the previous compaction...
    compaction_max_log_bytes: int = 256 * 1024 * 1024  # ...or after this many command bytes applied
    snapshot_in_background: bool = True  # pack the snapshot file off the replication thread
    password: str | None = None  # set: encrypted, authenticated transport between nodes
    password_salt: str = "raftbroker"  # per-cluster salt of the password's key derivation (transport.salted_password)
    max_command_bytes: int = 4 * 1024 * 1024  # larger commands fail with TOO_LARGE
    commands_queue_size: int = 10_000  # pysyncobj's submit queue (QUEUE_FULL beyond)
    max_pending_bytes: int = 256 * 1024 * 1024  # bytes submitted and not yet resolved (QUEUE_FULL)
    leader_fallback_timeout_s: float = 3.0  # a leader without a majority for this long steps down
    connection_timeout_s: float = 3.5
    connection_retry_s: float = 1.0
    # Incoming Raft connections that have not named a cluster member yet: closed timeout_s after their
    # accept, at most per_host_max per peer host and total_max in all (the oldest closed first). A
    # member names itself within a round trip; a stalled partial frame never does. Validated by
    # HandshakeLimits itself, and not tied to connection_timeout_s (silence on a member's connection:
    # drills set 60 s).
    handshake: HandshakeLimits = field(default_factory=HandshakeLimits)
    # The journal's segment files (journal.DurableJournal): a full one is sealed and the next started;
    # a compaction deletes the sealed segments it has passed, instead of rewriting the journal.
    journal_segment_bytes: int = SEGMENT_BYTES_DEFAULT
    # The newest commands the journal holds in memory; older entries are read back from the segments
    # (a follower behind, a restart's apply), so the log's length costs disk, not memory.
    journal_cache_bytes: int = CACHE_BYTES_DEFAULT
    # Records at least this long are written with O_DIRECT (0: every record through the page cache):
    # the journal's pages would only evict the store's, which are its read cache.
    journal_direct_write_min_bytes: int = DIRECT_WRITE_MIN_BYTES_DEFAULT
    journal_sync: str = "flagged"  # fsync entries submitted with sync=True ("flagged") or every entry ("all")
    pre_vote: bool = True  # ask a majority before campaigning (a restarting node cannot depose the leader)
    # Raft messages on the wire: "none" (pickle as is) or "zlib" (pysyncobj's). bench/NOTE.md, 2026-11-24:
    # zlib costs ~39x the pickling's CPU per MB per follower and saves 3-21 % of bytes on distinct payloads,
    # so the default is "none" (since 2026-11-25: the whole of `make test`, drills and election tests
    # included, passed with it; NOTES.md's "elections unstable without zlib" predates the large-command fix).
    raft_message_compression: str = "none"
    # Raft connections' SO_SNDBUF and SO_RCVBUF (the latter is also the size of one read). pysyncobj's
    # 64 KiB each made a 1 MiB entry cross to a follower in some eight poll rounds of both processes: one
    # producer's 1000 x 1 KiB batch took a median of 91-138 ms to commit on three nodes, 41-48 ms with
    # these (bench/NOTE.md, 2026-11-27 evening). Sending: a whole command (max_command_bytes) fits, so
    # the leader never waits for POLLOUT mid-entry. Receiving: 256 KiB, since a read of 512 KiB or more
    # costs ~20 us more per message here (glibc maps and unmaps a block that large for each read).
    # Linux doubles what is set and caps it at net.core.wmem_max / rmem_max (docs/operations.md).
    socket_send_buffer_bytes: int = 4 * 1024 * 1024
    socket_receive_buffer_bytes: int = 256 * 1024
    simulate_power_loss: bool = False  # tests: a restart drops what was not fsynced (also by env var)

    def __post_init__(self) -> None:
        o = self
        checks = [
            ("raft_min_timeout_s > 3 * append_entries_period_s", o.raft_min_timeout_s > 3 * o.append_entries_period_s),
            ("raft_max_timeout_s > raft_min_timeout_s", o.raft_max_timeout_s > o.raft_min_timeout_s),
            ("connection_timeout_s >= raft_max_timeout_s", o.connection_timeout_s >= o.raft_max_timeout_s),
            ("leader_fallback_timeout_s > append_entries_period_s",
             o.leader_fallback_timeout_s > o.append_entries_period_s),
            ("max_pending_bytes >= max_command_bytes", o.max_pending_bytes >= o.max_command_bytes),
            ("compaction_min_entries >= 2", o.compaction_min_entries >= 2),
            ("append_entries_batch_bytes is None or between 64 KiB and APPEND_ENTRIES_BATCH_BYTES_MAX",
             o.append_entries_batch_bytes is None
             or 64 * 1024 <= o.append_entries_batch_bytes <= APPEND_ENTRIES_BATCH_BYTES_MAX),
            ("positive periods, sizes and limits", min(
                o.auto_tick_period_s, o.compaction_min_time_s,
                o.compaction_max_log_bytes, o.max_command_bytes, o.commands_queue_size) > 0),
            ("connection_retry_s >= 0", o.connection_retry_s >= 0),
            ("0 <= commit_notice_delay_s <= append_entries_period_s",
             0 <= o.commit_notice_delay_s <= o.append_entries_period_s),
            ("auto_tick_period_s <= idle_poll_max_s <= 1", o.auto_tick_period_s <= o.idle_poll_max_s <= 1.0),
            ("journal_sync is flagged or all", o.journal_sync in ("flagged", "all")),
            ("journal_segment_bytes between 64 KiB and 1 GiB", 64 * 1024 <= o.journal_segment_bytes <= 1 << 30),
            ("journal_cache_bytes between 1 MiB and 4 GiB", 1 << 20 <= o.journal_cache_bytes <= 4 << 30),
            ("journal_direct_write_min_bytes between 0 and 1 GiB", 0 <= o.journal_direct_write_min_bytes <= 1 << 30),
            ("raft_message_compression is none or zlib", o.raft_message_compression in ("none", "zlib")),
            ("socket buffers between 64 KiB and 64 MiB",
             all(64 * 1024 <= size <= 64 * 1024 * 1024 for size in (o.socket_send_buffer_bytes,
                                                                    o.socket_receive_buffer_bytes))),
            ("password is None or non-empty, with a non-empty password_salt",
             (o.password is None or len(o.password) > 0) and len(o.password_salt) > 0),
        ]
        failed = [rule for rule, ok in checks if not ok]
        if failed:
            raise ValueError(f"invalid RaftOptions: {', '.join(failed)}")

    def batch_bytes(self) -> int:
        """``append_entries_batch_bytes``, or when None the least that sends every command whole."""
        if self.append_entries_batch_bytes is not None:
            return self.append_entries_batch_bytes
        return min(self.max_command_bytes + _ENTRY_FRAMING_BYTES, APPEND_ENTRIES_BATCH_BYTES_MAX)

    def to_conf(self, journal_file: Path, dump_file: Path, serializer: Callable[[str, object], None],
                deserializer: Callable[[str], tuple[object, ...]],
                serialize_checker: Callable[[], int] | None = None, *, bind_address: str | None = None) -> SyncObjConf:
        """The pysyncobj configuration for these options. The Raft port binds exactly ``bind_address``
        (``_RaftNode`` fills in its own address when None: pysyncobj alone would bind every interface)."""
        password = None if self.password is None else salted_password(self.password, self.password_salt)
        return SyncObjConf(
            bindAddress=bind_address,
            raftMinTimeout=self.raft_min_timeout_s, raftMaxTimeout=self.raft_max_timeout_s,
            appendEntriesPeriod=self.append_entries_period_s, autoTickPeriod=self.auto_tick_period_s,
            appendEntriesUseBatch=self.append_entries_use_batch,
            appendEntriesBatchSizeBytes=self.batch_bytes(),
            logCompactionMinEntries=self.compaction_min_entries, logCompactionMinTime=self.compaction_min_time_s,
            password=password, commandsQueueSize=self.commands_queue_size, commandsWaitLeader=False,
            leaderFallbackTimeout=self.leader_fallback_timeout_s, connectionTimeout=self.connection_timeout_s,
            connectionRetryTime=self.connection_retry_s,
            sendBufferSize=self.socket_send_buffer_bytes, recvBufferSize=self.socket_receive_buffer_bytes,
            journalFile=str(journal_file), fullDumpFile=str(dump_file), serializer=serializer,
            deserializer=deserializer, serializeChecker=serialize_checker,
            useFork=False, dynamicMembershipChange=True,
        )


def journal_sync_from_env(default: str) -> str:
    """``RAFTBROKER_JOURNAL_SYNC=all`` fsyncs every entry before it is acknowledged, whatever its
    topic's class (measurements and the cautious); ``flagged`` only ``sync=True`` submits."""
    value = os.environ.get(ENV_JOURNAL_SYNC, "") or default
    if value not in ("flagged", "all"):
        raise ValueError(f"{ENV_JOURNAL_SYNC} must be flagged or all, not {value!r}")
    return value


def simulate_power_loss_from_env() -> bool:
    """Tests: ``RAFTBROKER_SIMULATE_POWER_LOSS=1`` makes every (re)start drop what was not fsynced."""
    return os.environ.get(ENV_SIMULATE_POWER_LOSS, "") not in ("", "0")




class PysyncobjReplicator:
    """A :class:`broker.replication.Replicator` backed by pysyncobj (patched, see ``_patches``).

    Commands are accepted only on the leader: elsewhere ``submit`` fails at once with NOT_LEADER (or
    NO_LEADER when no leader is known) so the caller can redirect its client. Immediate failures
    (TOO_LARGE, NOT_LEADER, NO_LEADER, QUEUE_FULL) call the callback on the submitting thread; every
    other outcome arrives on the replication thread. ``close`` fails still-pending callbacks with
    TIMEOUT (outcome unknown). The journal and the snapshot file live in ``data_dir``.
    """

    def __init__(
        self,
        self_address: str,
        peer_addresses: list[str],
        data_dir: Path,
        state_machine: StateMachine,
        options: RaftOptions | None = None,
        restore: Restore | None = None,
    ) -> None:
        """``restore``: this node is a copy of another cluster's member started alone (see
        :class:`~broker.replication.raft_node.Restore`)."""
        for address in [self_address, *peer_addresses]:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"raft address must be 'host:port', got {address!r}")
        self._self_address = self_address
        self._peer_addresses = [a for a in dict.fromkeys(peer_addresses) if a != self_address]
        self._data_dir = Path(data_dir)
        self._state_machine = state_machine
        self._options = options or RaftOptions()
        self._restore = restore
        self._node: _RaftNode | None = None
        self._campaign_deferral: tuple[Callable[[], bool] | None, float] = (None, 0.0)  # defer_campaigns
        self._closed = False
        self._lock = threading.Lock()  # guards _pending and _pending_bytes
        self._pending: dict[int, tuple[Callback, int]] = {}
        self._pending_bytes = 0
        self._tokens = itertools.count(1)
        self._tick_calls: collections.deque[Callable[[], None]] = collections.deque()
        self._failure: BaseException | None = None
        self._codec: SnapshotCodec | None = None
        self._has_quorum = False  # set by the tick thread (pysyncobj's set arithmetic is not thread-safe)
        self._members = [self_address, *sorted(self._peer_addresses)]  # likewise
        self._counters = RaftCounters()  # metrics (stats()); written by the tick and snapshot threads
        self._leadership = LeadershipTracker(self._counters)

    @property
    def options(self) -> RaftOptions:
        return self._options

    @property
    def data_dir(self) -> Path:
        return self._data_dir

    def start(self) -> None:
        """Open journal and snapshot under ``data_dir``, bind the raft port, start the tick thread."""
        assert self._node is None and not self._closed, "start() may be called once"
        self._data_dir.mkdir(parents=True, exist_ok=True)
        set_message_compression(self._options.raft_message_compression)
        dump_path = self._data_dir / DUMP_FILE_NAME
        background = self._options.snapshot_in_background
        codec = SnapshotCodec(self._state_machine, self._data_dir / SNAPSHOT_WORK_DIR_NAME, dump_path,
                              background=background, on_restore_failure=self._halt,
                              write_latency=self._counters.snapshot_write,
                              take_latency=self._counters.snapshot_take,
                              restore_latency=self._counters.snapshot_restore)
        checker = (lambda: _SERIALIZER_STATES[codec.poll()]) if background else None
        conf = self._options.to_conf(self._data_dir / JOURNAL_FILE_NAME, dump_path, codec.write, codec.read,
                                     checker, bind_address=self._self_address)
        self._codec = codec
        _patches.register_transmission_opener(str(dump_path), functools.partial(codec.open_for_transmission,
                                                                                str(dump_path)))
        options = self._options
        node = _RaftNode(self._self_address, self._peer_addresses, conf, self._state_machine,
                         options.compaction_max_log_bytes, journal_sync=journal_sync_from_env(options.journal_sync),
                         pre_vote=None if options.pre_vote else False,
                         simulate_power_loss=options.simulate_power_loss or simulate_power_loss_from_env(),
                         counters=self._counters,
                         handshake_limits=options.handshake, commit_notice_delay_s=options.commit_notice_delay_s,
                         idle_poll_max_s=options.idle_poll_max_s,
                         journal_segment_bytes=options.journal_segment_bytes,
                         journal_cache_bytes=options.journal_cache_bytes,
                         journal_direct_write_min_bytes=options.journal_direct_write_min_bytes,
                         restore=self._restore)
        node.set_campaign_deferral(*self._campaign_deferral)
        # pysyncobj stops ticking when the thread that built the SyncObj exits; tie it to the process.
        node._SyncObj__mainThread = threading.main_thread()
        node.addOnTickCallback(functools.partial(self._on_tick, node))
        self._node = node
        if self._failure is not None:  # the tick thread failed a restore before _node was set
            node.halt()

    def _halt(self, failure: BaseException) -> None:
        """Called on the tick thread when a snapshot cannot be restored: stop serving for good."""
        logger.critical("raft halted on this node (it serves nothing until restarted with repaired data): %s: %s",
                        type(failure).__name__, failure)
        self._failure = failure
        if self._node is not None:
            self._node.halt()

    @property
    def failure(self) -> BaseException | None:
        """Why this node halted (a snapshot it could not restore, a failed journal write, or a storage
        failure while applying, e.g. a full disk), or None while healthy. Health and the node's reads
        refuse on it: an apply halt leaves the store behind the log for good, so its reads are stale."""
        if self._failure is not None:
            return self._failure
        node = self._node
        return node.halt_reason if node is not None and node.halted else None

    def leader_contact(self) -> tuple[int | None, float]:
        """Follower side, from any thread: (the commit index the leader last announced to this node,
        None if none yet; seconds since a current leader's message last reached it, inf if never)."""
        node = self._node
        if node is None:
            return None, math.inf
        commit = getattr(node, "_SyncObj__leaderCommitIndex", None)
        last = getattr(node, "_last_leader_contact", -math.inf)
        return (commit if isinstance(commit, int) else None), max(0.0, pysyncobj_monotonic() - last)

    def submit(self, command: bytes | CommandPieces, callback: Callback, *, sync: bool = False) -> None:
        """Append ``command`` if this node leads; see the class docstring for where callbacks run.

        ``sync=True``: the entry is fsynced by the leader and by every follower before they
        acknowledge it, so the callback's success means a majority holds it on stable storage.
        """
        size = command_size(command)
        if size > self._options.max_command_bytes:
            limit = self._options.max_command_bytes
            _call(callback, None, ReplicationError(FailReason.TOO_LARGE, f"{size} > {limit} bytes"))
            return
        node = self._node
        refusal = self._leader_refusal(node)
        if refusal is not None or node is None:
            _call(callback, None, refusal or ReplicationError(FailReason.NO_LEADER))
            return
        token = next(self._tokens)
        with self._lock:  # close() drains _pending under this lock after setting _closed
            refusal = None
            if self._closed:
                refusal = ReplicationError(FailReason.NO_LEADER, "replicator is not running")
            elif self._pending_bytes + size > self._options.max_pending_bytes:
                refusal = ReplicationError(FailReason.QUEUE_FULL, "too many pending bytes")
            else:
                self._pending[token] = (callback, size)
                self._pending_bytes += size
        if refusal is not None:
            _call(callback, None, refusal)
            return
        node.submit_command(command, functools.partial(self._complete, token), sync=sync)

    def _complete(self, token: int, result: object, code: int, denied: str = "") -> None:
        with self._lock:
            entry = self._pending.pop(token, None)
            if entry is not None:
                self._pending_bytes -= entry[1]
        if entry is None:  # already failed by close()
            return
        if code == FAIL_REASON.SUCCESS:
            _call(entry[0], result, None)
        else:
            message = denied if code == FAIL_REASON.REQUEST_DENIED else ""
            node = self._node
            if code == FAIL_REASON.NOT_LEADER and node is not None and node.transfer_target_address:
                message = node.transfer_target_address  # refused while handing over: redirect there
            _call(entry[0], None, ReplicationError(map_fail_reason(code), message))

    # -- membership (broker.replication.Membership) ---------------------------------------------
    def members(self) -> list[str]:
        """Raft addresses of the current configuration, this node first (as of the last tick)."""
        return list(self._members)

    def add_member(self, raft_address: str, callback: Callback) -> None:
        """Append a configuration with ``raft_address`` (leader only); the callback runs on commit.

        pysyncobj changes one member at a time and applies a configuration when it is appended:
        the new node counts in the majority at once, so it should be running (with the current
        members as peers) and will catch up from the leader's snapshot and log."""
        self._change_member("add", raft_address, callback)

    def remove_member(self, raft_address: str, callback: Callback) -> None:
        """Append a configuration without ``raft_address`` (leader only, never the leader itself)."""
        self._change_member("rem", raft_address, callback)

    def _change_member(self, kind: str, raft_address: str, callback: Callback) -> None:
        host, _, port = raft_address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"raft address must be 'host:port', got {raft_address!r}")
        node = self._node
        refusal = self._leader_refusal(node)
        if refusal is None and kind == "rem" and raft_address == self._self_address:
            refusal = ReplicationError(FailReason.NOT_LEADER, "the leader cannot remove itself: transfer first")
        if refusal is not None or node is None:
            _call(callback, None, refusal or ReplicationError(FailReason.NO_LEADER))
            return
        token = next(self._tokens)
        with self._lock:
            if self._closed:
                refusal = ReplicationError(FailReason.NO_LEADER, "replicator is not running")
            else:
                self._pending[token] = (callback, 0)
        if refusal is not None:
            _call(callback, None, refusal)
            return
        denied = ("refused: another membership change is not committed yet, the node is already in (or "
                  "not in) the configuration, or this leader's first entry is not committed yet")
        change = node.addNodeToCluster if kind == "add" else node.removeNodeFromCluster
        change(raft_address, callback=functools.partial(self._complete, token, denied=denied))

    def _leader_refusal(self, node: _RaftNode | None) -> ReplicationError | None:
        if node is None or self._closed or node.halted:
            return ReplicationError(FailReason.NO_LEADER, "replicator is not running")
        if not node._isLeader():
            leader = node._getLeader()
            if leader is None:
                return ReplicationError(FailReason.NO_LEADER)
            return ReplicationError(FailReason.NOT_LEADER, str(leader.id))
        target = node.transfer_target_address
        if target is not None:  # handing leadership over: writes go to the target
            return ReplicationError(FailReason.NOT_LEADER, target)
        return None

    def _on_tick(self, node: _RaftNode) -> None:
        journal = node.journal
        if journal is not None:
            if journal.failure is not None and not node.halted:
                self._halt(journal.failure)  # a failed write or fsync: stop, as after a failed restore
                return
            self._counters.journal_cached_bytes = journal.cached_bytes
            self._counters.journal_read_backs = journal.read_backs
        self._has_quorum = bool(node.hasQuorum)
        others = sorted(str(n.id) for n in node.otherNodes)
        if others != self._members[1:]:
            self._members = [self._self_address, *others]
        self._track_leadership(node)
        while self._tick_calls:
            try:
                self._tick_calls.popleft()()
            except Exception:
                logger.exception("call on the replication thread failed")

    def status(self) -> ReplicaStatus:
        """Live role, term, indexes and leader (thread-safe reads); ``has_quorum`` as of the last tick.

        Cheap (a few microseconds): fine to poll from metrics or per request.
        """
        node = self._node
        if node is None:
            return ReplicaStatus(self._self_address, Role.FOLLOWER, 0, 0, 0, None, False)
        if self._closed or node.halted:
            failure = self._failure or node.halt_reason
            reason = None if failure is None else f"{type(failure).__name__}: {failure}"
            return ReplicaStatus(self._self_address, Role.FOLLOWER, node.raftCurrentTerm, node.raftCommitIndex,
                                 node.raftLastApplied, None, False, reason)
        role, term, commit_index, applied_index, leader, has_quorum, ready = node.status_fields(self._has_quorum)
        return ReplicaStatus(self._self_address, role, term, commit_index, applied_index, leader, has_quorum,
                             leader_ready=ready)

    def _track_leadership(self, node: _RaftNode) -> None:
        """Tick thread: feed the leader seen and, as leader, the followers' match indexes to the stats."""
        leader = node._getLeader()
        leading = node._isLeader()
        matches = {str(n.id): i for n, i in node._SyncObj__raftMatchIndex.items()} if leading else {}
        self._leadership.observe(None if leader is None else str(leader.id), leading,
                                 node._SyncObj__getCurrentLogIndex(), matches, pysyncobj_monotonic())

    def stats(self) -> RaftStats:
        """Elections, leader changes, follower lag (as leader; refreshed every ``LAG_PERIOD_S``),
        fsync and snapshot latencies: a point-in-time copy, safe from any thread."""
        return self._counters.snapshot()

    def pending_count(self) -> int:
        """Commands submitted and not yet resolved."""
        return len(self._pending)

    def log_entry_size_bytes(self, index: int) -> int | None:
        """Diagnostics: bytes of the Raft log entry at ``index`` as stored and sent, None if not held."""
        node = self._node
        return None if node is None else node.log_entry_size_bytes(index)

    def defer_campaigns(self, defer: Callable[[], bool], max_s: float) -> None:
        """Before :meth:`start`: while ``defer()`` is true this node starts no election of its own, for
        at most ``max_s`` at a time (``prevote.PreVoteMixin.set_campaign_deferral``; needs PreVote)."""
        assert self._node is None, "set before start()"
        self._campaign_deferral = (defer, max_s)

    def transfer_leadership(self, target_address: str | None = None) -> bool:
        """Hand leadership to ``target_address`` (or the most caught-up connected peer).

        The leader stops accepting commands at once (they fail with NOT_LEADER naming the target),
        sends TimeoutNow when the target holds its whole log, and accepts commands again if the
        target has not taken over within one election timeout (``raft_max_timeout_s``). True when
        the transfer started; poll :meth:`status` to see the new leader. Waits at most about a
        second for the tick thread; must not be called from a callback.
        """
        timeout_s = self._options.raft_max_timeout_s
        node = self._node
        if node is None or self._closed or threading.current_thread() is node._SyncObj__thread:
            return False
        sent = threading.Event()
        outcome: list[bool] = []

        def begin() -> None:
            outcome.append(node.begin_transfer(target_address, timeout_s))
            sent.set()

        self._tick_calls.append(begin)
        node.wake()
        return sent.wait(_TRANSFER_WAIT_S) and outcome[0]

    def force_compaction(self) -> None:
        """Snapshot and drop the covered log prefix at the next tick."""
        if self._node is not None:
            self._node.forceLogCompaction()

    def close(self) -> None:
        """Stop the tick thread, close sockets and files; fail pending callbacks with TIMEOUT."""
        with self._lock:
            already_closed, self._closed = self._closed, True
        node = self._node
        if node is None or already_closed:
            return
        node.destroy()
        thread = node._SyncObj__thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(_CLOSE_JOIN_S)
            if thread.is_alive():
                logger.error("raft tick thread did not stop within %.1f s", _CLOSE_JOIN_S)
        if self._codec is not None:
            self._codec.close(_CLOSE_JOIN_S)
            _patches.forget_transmission_opener(str(self._data_dir / DUMP_FILE_NAME))
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
            self._pending_bytes = 0
        for callback, _size in pending:
            _call(callback, None, ReplicationError(FailReason.TIMEOUT, "replicator closed"))


def _call(callback: Callback, result: object, error: ReplicationError | None) -> None:
    """Run a user callback; never let its exception reach pysyncobj (it would re-apply the entry)."""
    try:
        callback(result, error)
    except Exception:
        logger.exception("replication callback failed")
