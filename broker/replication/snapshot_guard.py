"""Stale snapshots and stale replies (Raft paper Fig. 13 rule 6; Ongaro's thesis §5.4.1).

Stock pysyncobj lets a follower install any snapshot a leader streams to it: ``__loadDumpFile(
clearJournal=True)`` then drops the follower's whole log, including entries past the snapshot that
it already acknowledged. A leader streams an old snapshot when a stale "reset" reply (the answer to
a request sent before the leader corrected its view of the follower) moves the follower's next
index below the leader's compacted prefix. An entry committed with that follower's acknowledgement
alone is then lost if the leader dies before the follower catches up again.

:class:`SnapshotGuardMixin` closes both halves:

* Follower: a received snapshot is written to its own file first and compared with the log. When
  the log holds the snapshot's last entry with the same term, or the snapshot ends at or below the
  commit index, it is not installed: the log (and the state machine) stay, and the reply tells the
  leader the follower matches up to ``max(snapshot index (if held), commit index)``.
* Leader: every AppendEntries carries a per-follower sequence number (``rb_seq``) that the follower
  echoes, with its term, in its reply. A reply from an older term is dropped; a reset answering a
  request sent before the leader last acted on a reset, or before it last sent a snapshot, is
  dropped (a fresh reset is still honoured, so a follower that really lost entries is probed).

Peers that do not send the new fields (stock pysyncobj) are handled as before. The behaviour is
named ``stale_snapshot`` in :mod:`broker.replication._patches` so that tests can switch it off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from broker.replication.journal import SyncingTransport

logger = logging.getLogger(__name__)

_LEADER_STATE = 2
_INCOMING_SUFFIX = ".incoming"


class SnapshotGuardMixin:
    """Mixed into the ``SyncObj`` subclass before ``SyncObj``; call :meth:`_init_snapshot_guard` first."""

    def _init_snapshot_guard(self, enabled: bool, dump_file: Path,
                             read_raft_data: Callable[[str], tuple[object, ...]]) -> None:
        self.snapshot_guard_enabled = enabled
        self._incoming_path = Path(str(dump_file) + _INCOMING_SUFFIX)
        self._incoming: IO[bytes] | None = None
        self._read_raft_data = read_raft_data
        self._sent_seq: dict[Any, int] = {}  # leader: last rb_seq sent to each follower
        self._reset_floor: dict[Any, int] = {}  # leader: resets answering rb_seq <= this are stale
        self._replying_to_seq: int | None = None  # follower: rb_seq of the message being handled
        self.stale_replies_dropped = 0
        self.stale_snapshots_refused = 0

    # -- outgoing (called by StampingTransport.send) ---------------------------------------------
    def stamp_outgoing(self, node: Any, message: Any) -> None:
        """Add ``rb_seq`` to a leader's AppendEntries and ``rb_seq``/``term`` to a follower's reply."""
        if not self.snapshot_guard_enabled or not isinstance(message, dict):
            return
        s: Any = self
        kind = message.get("type")
        if kind == "append_entries":
            seq = self._sent_seq.get(node, 0) + 1
            self._sent_seq[node] = seq
            message["rb_seq"] = seq
            if message.get("serialized") is not None:  # replies to anything sent before are stale
                self._reset_floor[node] = seq
        elif kind == "next_node_idx":
            message["term"] = s.raftCurrentTerm
            if self._replying_to_seq is not None:
                message["rb_seq"] = self._replying_to_seq

    # -- incoming ---------------------------------------------------------------------------------
    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 (pysyncobj's name)
        kind = message.get("type") if isinstance(message, dict) else None
        if not self.snapshot_guard_enabled or kind not in ("append_entries", "next_node_idx"):
            super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]
            return
        s: Any = self
        if kind == "next_node_idx":
            if s._SyncObj__raftState == _LEADER_STATE and self._is_stale_reply(node, message):
                self.stale_replies_dropped += 1
                return
            super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]
            return
        self._replying_to_seq = message.get("rb_seq")
        try:
            serialized = message.get("serialized")
            if serialized is None or "prevLogIdx" in message or message["term"] < s.raftCurrentTerm:
                super()._SyncObj__onMessageReceived(node, message)  # type: ignore[misc]
                return
            complete = self._receive_chunk(serialized)
            # pysyncobj handles term, leader and commit index; the snapshot itself is ours.
            super()._SyncObj__onMessageReceived(node, {**message, "serialized": None})  # type: ignore[misc]
            if complete:
                self._install_or_refuse(node, message["commit_index"])
        finally:
            self._replying_to_seq = None

    def _is_stale_reply(self, node: Any, message: dict[str, Any]) -> bool:
        s: Any = self
        term = message.get("term")
        if term is not None and term < s.raftCurrentTerm:
            return True
        seq = message.get("rb_seq")
        if not message.get("reset") or seq is None:
            return False
        if seq <= self._reset_floor.get(node, 0):
            return True
        # Acting on this reset: the answers to requests already sent were built on the old view.
        self._reset_floor[node] = self._sent_seq.get(node, 0)
        return False

    def _receive_chunk(self, serialized: Any) -> bool:
        """Append one chunk to the incoming file; True when the snapshot is complete."""
        data, is_first, is_last = serialized
        if is_first:
            if self._incoming is not None:
                self._incoming.close()
            self._incoming = open(self._incoming_path, "wb")  # noqa: SIM115 (spans messages)
        elif self._incoming is None:
            return False
        self._incoming.write(data)
        if not is_last:
            return False
        self._incoming.close()
        self._incoming = None
        return True

    def _install_or_refuse(self, node: Any, leader_commit_index: int) -> None:
        s: Any = self
        try:
            last_entry = self._read_raft_data(str(self._incoming_path))[0]
        except Exception:
            logger.exception("received snapshot %s is unreadable: ignored", self._incoming_path)
            self._incoming_path.unlink(missing_ok=True)
            return
        assert isinstance(last_entry, tuple)
        index, term = last_entry[1], last_entry[2]
        held = s._SyncObj__getEntries(index, 1)
        holds_last = bool(held) and held[0][1] == index and held[0][2] == term
        commit_index = s.raftCommitIndex
        if holds_last or index <= commit_index:
            self._incoming_path.unlink(missing_ok=True)
            self.stale_snapshots_refused += 1
            matched = max(index if holds_last else 0, commit_index)
            logger.warning("refused a snapshot at index %d (term %d): the log ends at %d, commit index %d, %s",
                           index, term, s._SyncObj__getCurrentLogIndex(), commit_index,
                           "holds its last entry" if holds_last else "committed past it")
            s._SyncObj__sendNextNodeIdx(node, nextNodeIdx=matched + 1, success=True)
            return
        os.replace(self._incoming_path, s.conf.fullDumpFile)
        s._SyncObj__loadDumpFile(clearJournal=True)
        # As pysyncobj after an install: the commit index may follow the leader up to the log's end.
        new_commit = min(leader_commit_index, s._SyncObj__getCurrentLogIndex())
        if new_commit > s._SyncObj__raftCommitIndex:
            s._SyncObj__raftCommitIndex = new_commit
            s._SyncObj__raftLog.setRaftCommitIndex(new_commit)
        s._SyncObj__sendNextNodeIdx(node, success=True)


class StampingTransport(SyncingTransport):
    """The syncing transport, letting the node stamp each message (:meth:`stamp_outgoing`) first."""

    def send(self, node: Any, message: Any) -> bool:
        stamp = getattr(self._syncObj, "stamp_outgoing", None)
        if stamp is not None:
            stamp(node, message)
        return super().send(node, message)
