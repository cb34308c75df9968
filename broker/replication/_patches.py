"""Pinned source patches to pysyncobj 0.3.17 (see docs/design/replication.md for the reasoning).

Every patch names the exact source it rewrites: at import this module checks the pysyncobj version
and the sha256 of each method it patches, and builds every patched method (each textual replacement
must match exactly once), so an upgraded or different pysyncobj fails loudly here instead of running
with a silently wrong patch. :func:`apply_patches` switches each patch on or off independently; it is
process-wide and only affects ``SyncObj`` instances created afterwards (pysyncobj binds the message
handler when a node is constructed). The environment variable ``RAFTBROKER_PYSYNCOBJ_PATCHES_OFF``
(comma-separated patch names) is read by :func:`apply_patches_from_env`, which ``raft.py`` calls at
import: tests use it to prove that each patch matters.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import linecache
import os
import textwrap
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pysyncobj.journal as pysyncobj_journal
import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.serializer as pysyncobj_serializer
import pysyncobj.syncobj as pysyncobj_syncobj
import pysyncobj.transport as pysyncobj_transport
import pysyncobj.version as pysyncobj_version

PINNED_VERSION = "0.3.17"
PATCH_NAMES = ("pickle5", "large_command", "append_entries", "prevote", "journal_sync", "stale_snapshot")
# Behaviours of our own (not source patches) that tests switch off the same way, to prove they matter:
# prevote (raft._RaftNode asks before it campaigns) and journal_sync (journal.DurableJournal fsyncs
# entries before they are acknowledged; off, only term/vote records are synced) and stale_snapshot
# (snapshot_guard.SnapshotGuardMixin: refuse snapshots the log already covers, drop stale replies).
BEHAVIOUR_NAMES = ("prevote", "journal_sync", "stale_snapshot")
ENV_PATCHES_OFF = "RAFTBROKER_PYSYNCOBJ_PATCHES_OFF"

_STOCK_PICKLE_PROTOCOL = 2
PATCHED_PICKLE_PROTOCOL = 5
_PICKLE_SOURCE_SHA256 = {
    "dump": "8632a4ffab1a6a8ad533a7c2d382d689623a7d138a2e2d8ab5bcf5a3240c6108",
    "dumps": "9d907d0e2ec813650c6498b0bdb9b996ae8f058f520a5c810363f7c07f51bc5d",
}


# Not patched, but relied upon by the journal and PreVote: SyncObj.__init__ builds the journal with
# the module global createJournal (hooked below), creates self._poller before the transport and
# passes itself to transportClass; every message leaves through TCPTransport.send
# (journal.SyncingTransport holds them back until the journal is synced); __applyLogEntries is the
# only place callbacks report success (overridden: sync first); __connectedToAnyone is called only by
# the election check in _onTick (overridden: the PreVote gate); the journal is only used through
# these methods and __loadDumpFile/__tryLogCompaction/__onMessageReceived, pinned elsewhere.
# raft_node._RaftNode overrides __getEntries with the same result (DurableJournal.entries_from reads
# back only the entries it returns).
_JOURNAL_RELIED_UPON_SHA256 = {
    (pysyncobj_syncobj.SyncObj, "__init__"): "09df12cd7fd7d7270fee82c1a025acc1f3a68e98dafbad81be467947ab95cbf0",
    (pysyncobj_syncobj.SyncObj, "_SyncObj__applyLogEntries"): (
        "073db677773b5a2dddf17cc51f84ac8803ed456da0f0011e15240d6bd1600684"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__connectedToAnyone"): (
        "acd40e9e3ac6c4cc1f4428e725fb008e06ee9bfce0240dc104fc04fa5eb1b4e5"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__deleteEntriesFrom"): (
        "3b23c411bb903d365575a2783d536e04c23bcf11cb7ddffa763915b4efd3831b"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__deleteEntriesTo"): (
        "b7b29988856a66b359c875b708f9dd8a056d29436507013592f5ec307e624faa"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__getEntries"): (
        "e29c4b33293b21018d1124c7e5835748c4c8092f7ce4af9e86f24633ccec7e0e"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__setCurrentTerm"): (
        "0ad5bf456ac06bd314d2dbc8991c6b6240e63bf33aaa975620aa84a7079d5f39"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__onBecomeLeader"): (
        "5a3fd97bc17dc1cf3070b007538b6a8d46adb71f0b6523f3922dc953420645e8"
    ),
    (pysyncobj_transport.TCPTransport, "send"): "2fd6c84b8621427d4bdc7742fa93271ba81dca0e0b4b22ff7b5ea989c976f166",
    # Membership: raft.PysyncobjReplicator calls addNodeToCluster/removeNodeFromCluster (one change
    # at a time, __changeCluster); _RaftNode replays the log's changes after a restart through
    # __parseChangeClusterRequest/__doChangeCluster, relying on __doChangeCluster being a no-op for a
    # node already in (or out of) the configuration when __doApplyCommand applies the entry again.
    # _RaftNode overrides __doApplyCommand for the large commands it built itself (raft_node.entry_command)
    # and hands every other entry to this one, whose REGULAR branch calls the method by id.
    (pysyncobj_syncobj.SyncObj, "addNodeToCluster"): "409209c3165ec2dc83dca52c2a7399084299dc5842ddc12e2a5f72581cca63b6",
    (pysyncobj_syncobj.SyncObj, "removeNodeFromCluster"): (
        "a655f3c1f147299823a8152d7ed9e15b5812af2d264fca8dc8c667faf9566877"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__changeCluster"): (
        "66b42884f9d2dbd1d27daaf1e1aa93d97c8969705b782b4837b7741d94746da6"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__doChangeCluster"): (
        "247d4d4101b8cd3ce82232ec9cf69d3556c78df7e6d0002a277d38676e630350"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__parseChangeClusterRequest"): (
        "b2d5d695b12e592fd32dc956415884096f7d13cd8f7b2cf69d4b8d3c2bb0178f"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__doApplyCommand"): (
        "1ea7aa506e950d0aecc7aa7ea750a6fc1164cbff9b208784fe4724dfe1ec91dc"
    ),
    (pysyncobj_journal, "createJournal"): "9ea9e463ae2a0b8bc28887a9cc9ec1f58b2b789c33a2f88973182d69a47d1169",
}

# Not patched, but relied upon: snapshot.SnapshotCodec raises from the serializer to continue in the
# background (serialize() then leaves pid at -2, skips its rename, and defers to serializeChecker,
# which alone resets pid on SUCCESS/FAILED); raft._RaftNode overrides __loadDumpFile,
# __sendNextNodeIdx, __setState (compaction thresholds are read from the conf at every tick by
# __tryLogCompaction), _onTick (the election check precedes the poll; its leader commit rule is
# repeated by _RaftNode._advance_leader_commit right after appending), _checkCommandsToApply
# and __sendAppendEntries (skipped while _checkCommandsToApply appends, which then sends once: it
# is the only call inside that method).
_RELIED_UPON_SHA256 = {
    (pysyncobj_syncobj.SyncObj, "_SyncObj__setState"): (
        "2c1f239f7bd79b3945b63418b4f564c40c07893d3cf747af2ddd5c6a045093a8"
    ),
    (pysyncobj_syncobj.SyncObj, "_onTick"): "cc9eb08232d005ba4e21a33ec453e5d02fe3537dadebda8571406c57f65a3c37",
    (pysyncobj_syncobj.SyncObj, "_SyncObj__tryLogCompaction"): (
        "c2f8a0ec14cc7312e3ff41a16cde9be71ff0f908bd66aec9e2673d97a775be2c"
    ),
    (pysyncobj_syncobj.SyncObj, "_checkCommandsToApply"): (
        "a386a8079361d204f2c11f895416548c432a254671a9114258921c25108a966e"
    ),
    (pysyncobj_serializer.Serializer, "serialize"): "a26f44b07da07430234d4ef0c194ad8bd4d73a89c396dbe4520ff4273c10ce3e",
    (pysyncobj_serializer.Serializer, "checkSerializing"): (
        "5b461fab822814ee266e12a2ffc23af4c5350620524f534eb00ddb61117cb339"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__loadDumpFile"): (
        "ec66e83905de703bcead2735be875e71870a6bbe271c854867611e555a90bbba"
    ),
    (pysyncobj_syncobj.SyncObj, "_SyncObj__sendNextNodeIdx"): (
        "68aaeefc267b8896bc1074280ac2aa014c3306d9f207949ed945569cef5d114c"
    ),
    # Opens its file with the module global open(fileName, 'rb') once per transmission, then only
    # read()s chunks of it (the transmission hook below).
    (pysyncobj_serializer.Serializer, "getTransmissionData"): (
        "301962f9293db4660bdc0e3200307b53ee98f4e75dea392c8b6d5246d7deadec"
    ),
}


class PysyncobjPatchError(ImportError):
    """The installed pysyncobj is not the source these patches were written and reviewed against."""


@dataclass(frozen=True)
class _MethodPatch:
    """Exact textual replacements in one ``SyncObj`` method (``attr`` is the mangled name)."""

    name: str
    attr: str
    source_sha256: str
    replacements: tuple[tuple[str, str], ...]


# (b) Chunked transfer of one entry >= appendEntriesBatchSizeBytes: the "finish" chunk is chosen by
# comparing with the command's length, but the chunks slice the pickled entry, which is longer. When
# the entry's last chunk starts past the command's end, the follower unpickles a truncated entry on
# every resend and replication wedges. Compare with the pickled entry's length.
_LARGE_COMMAND = _MethodPatch(
    name="large_command",
    attr="_SyncObj__sendAppendEntries",
    source_sha256="9cb9073128c392fa9e5efc4691420ba435bfafb4c74e83a34f931fa16aa760c6",
    replacements=(
        (
            "elif pos + batchSizeBytes >= len(entries[0][0]):",
            "elif pos + batchSizeBytes >= len(entry):  # raftbroker patch: the pickled entry's length",
        ),
    ),
)

_FOLLOWER_OLD = """\
                if len(prevEntries) > 1:
                    # rollback cluster changes
                    if self.__conf.dynamicMembershipChange:
                        for entry in reversed(prevEntries[1:]):
                            clusterChangeRequest = self.__parseChangeClusterRequest(entry[0])
                            if clusterChangeRequest is not None:
                                self.__doChangeCluster(clusterChangeRequest, reverse=True)

                    if prevLogIdx + 1 <= self.__raftLastApplied:
                        logger.critical(
                            'truncating already-applied log entries from index %d '
                            '(last applied: %d) - state machine may have diverged from '
                            'other cluster members', prevLogIdx + 1, self.__raftLastApplied)
                    self.__deleteEntriesFrom(prevLogIdx + 1)
                for entry in newEntries:
                    self.__raftLog.add(*entry)

                # apply cluster changes
                if self.__conf.dynamicMembershipChange:
                    for entry in newEntries:
                        clusterChangeRequest = self.__parseChangeClusterRequest(entry[0])
                        if clusterChangeRequest is not None:
                            self.__doChangeCluster(clusterChangeRequest)

                nextNodeIdx = prevLogIdx + 1
                if newEntries:
                    nextNodeIdx = newEntries[-1][1] + 1

                self.__sendNextNodeIdx(node, nextNodeIdx=nextNodeIdx, success=True)
"""

_FOLLOWER_NEW = """\
                # raftbroker patch (append_entries): Raft receiver rules 3-4. Skip the entries this
                # log already holds with the same term; delete only from the first real conflict.
                lastLogIdx = self.__getCurrentLogIndex()
                heldCount = 0
                for entry in newEntries:
                    if entry[1] > lastLogIdx or self.__getEntries(entry[1], 1)[0][2] != entry[2]:
                        break
                    heldCount += 1
                appendedEntries = newEntries[heldCount:]
                if appendedEntries and appendedEntries[0][1] <= lastLogIdx:
                    conflictIdx = appendedEntries[0][1]
                    # rollback cluster changes
                    if self.__conf.dynamicMembershipChange:
                        for entry in reversed(self.__getEntries(conflictIdx)):
                            clusterChangeRequest = self.__parseChangeClusterRequest(entry[0])
                            if clusterChangeRequest is not None:
                                self.__doChangeCluster(clusterChangeRequest, reverse=True)

                    if conflictIdx <= self.__raftLastApplied:
                        logger.critical(
                            'truncating already-applied log entries from index %d '
                            '(last applied: %d) - state machine may have diverged from '
                            'other cluster members', conflictIdx, self.__raftLastApplied)
                    self.__deleteEntriesFrom(conflictIdx)
                for entry in appendedEntries:
                    self.__raftLog.add(*entry)

                # apply cluster changes
                if self.__conf.dynamicMembershipChange:
                    for entry in appendedEntries:
                        clusterChangeRequest = self.__parseChangeClusterRequest(entry[0])
                        if clusterChangeRequest is not None:
                            self.__doChangeCluster(clusterChangeRequest)

                nextNodeIdx = prevLogIdx + 1
                if newEntries:
                    nextNodeIdx = newEntries[-1][1] + 1
                # Entries after this index were not checked against the leader's log.
                coveredIdx = nextNodeIdx - 1

                self.__sendNextNodeIdx(node, nextNodeIdx=nextNodeIdx, success=True)
"""

# (c) AppendEntries safety: the follower rules above, plus the commit index a follower adopts is
# capped at the last index the message proved to match the leader (entries past it may be a stale
# tail), plus the leader keeps the larger next index on success and the smaller one on reset.
_APPEND_ENTRIES = _MethodPatch(
    name="append_entries",
    attr="_SyncObj__onMessageReceived",
    source_sha256="ddfe34b6c02821795146dc533fb7c0fcf6574a082a68a227b4c885c9e14be206",
    replacements=(
        (
            "            # Regular append entries\n            if 'prevLogIdx' in message:\n",
            "            # raftbroker patch: the last index this message proved to match the leader's log\n"
            "            coveredIdx = self.__raftCommitIndex\n"
            "            # Regular append entries\n            if 'prevLogIdx' in message:\n",
        ),
        (_FOLLOWER_OLD, _FOLLOWER_NEW),
        (
            "                    self.__loadDumpFile(clearJournal=True)\n",
            "                    self.__loadDumpFile(clearJournal=True)\n"
            "                    coveredIdx = self.__getCurrentLogIndex()  # raftbroker patch\n",
        ),
        (
            "            if leaderCommitIndex > self.__raftCommitIndex:\n"
            "                self.__raftCommitIndex = min(leaderCommitIndex, self.__getCurrentLogIndex())\n",
            "            # raftbroker patch: never adopt a commit index past what this message proved.\n"
            "            newCommitIndex = min(leaderCommitIndex, coveredIdx, self.__getCurrentLogIndex())\n"
            "            if newCommitIndex > self.__raftCommitIndex:\n"
            "                self.__raftCommitIndex = newCommitIndex\n",
        ),
        (
            "                if reset:\n"
            "                    self.__raftNextIndex[node] = nextNodeIdx\n"
            "                if success:\n"
            "                    if self.__raftMatchIndex[node] < currentNodeIdx:\n"
            "                        self.__raftMatchIndex[node] = currentNodeIdx\n"
            "                        self.__raftNextIndex[node] = nextNodeIdx\n",
            "                # raftbroker patch: replies to pipelined requests arrive out of step with the\n"
            "                # optimistic next index; a success never moves it back, a reset never forward.\n"
            "                if reset and nextNodeIdx < self.__raftNextIndex[node]:\n"
            "                    self.__raftNextIndex[node] = nextNodeIdx\n"
            "                if success:\n"
            "                    if self.__raftMatchIndex[node] < currentNodeIdx:\n"
            "                        self.__raftMatchIndex[node] = currentNodeIdx\n"
            "                    if self.__raftNextIndex[node] < nextNodeIdx:\n"
            "                        self.__raftNextIndex[node] = nextNodeIdx\n",
        ),
    ),
)

_METHOD_PATCHES = (_LARGE_COMMAND, _APPEND_ENTRIES)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _mismatch(what: str, detail: str) -> PysyncobjPatchError:
    return PysyncobjPatchError(
        f"raftbroker's pysyncobj patches were written against pysyncobj {PINNED_VERSION}; "
        f"{what} {detail}. Re-review broker/replication/_patches.py against the installed source "
        "before changing the pinned version."
    )


def _build(patch: _MethodPatch, original: types.FunctionType) -> types.FunctionType:
    """Compile ``original``'s source with ``patch.replacements`` as a ``SyncObj`` method."""
    source = inspect.getsource(original)
    digest = _sha256(source)
    if digest != patch.source_sha256:
        raise _mismatch(f"SyncObj.{patch.attr} (patch {patch.name})", f"has sha256 {digest}")
    for old, new in patch.replacements:
        count = source.count(old)
        if count != 1:
            raise _mismatch(f"patch {patch.name}", f"expected 1 match of {old[:60]!r}, found {count}")
        source = source.replace(old, new)
    # Compiling inside ``class SyncObj`` gives the same name mangling (self.__x -> self._SyncObj__x).
    body = textwrap.indent(textwrap.dedent(source), "    ")
    filename = f"<raftbroker patch {patch.name}: pysyncobj/syncobj.py SyncObj.{patch.attr}>"
    wrapped = "class SyncObj:\n" + body
    linecache.cache[filename] = (len(wrapped), None, wrapped.splitlines(True), filename)
    namespace: dict[str, object] = {}
    exec(compile(wrapped, filename, "exec"), pysyncobj_syncobj.__dict__, namespace)
    patched = vars(namespace["SyncObj"])[patch.attr]
    assert isinstance(patched, types.FunctionType), patch.attr
    return patched


def _check_pickle_module() -> None:
    protocol = pysyncobj_pickle.__dict__.get("__protocol")
    if protocol not in (_STOCK_PICKLE_PROTOCOL, PATCHED_PICKLE_PROTOCOL):
        raise _mismatch("pysyncobj.pickle.__protocol", f"is {protocol!r}, expected 2")
    for name, expected in _PICKLE_SOURCE_SHA256.items():
        digest = _sha256(inspect.getsource(getattr(pysyncobj_pickle, name)))
        if digest != expected:
            raise _mismatch(f"pysyncobj.pickle.{name}", f"has sha256 {digest}")


def _load() -> tuple[dict[str, types.FunctionType], dict[str, types.FunctionType]]:
    if pysyncobj_version.VERSION != PINNED_VERSION:
        raise _mismatch("the installed version", f"is {pysyncobj_version.VERSION}")
    _check_pickle_module()
    for (owner, attr), expected in {**_RELIED_UPON_SHA256, **_JOURNAL_RELIED_UPON_SHA256}.items():
        digest = _sha256(inspect.getsource(vars(owner)[attr]))
        if digest != expected:
            raise _mismatch(f"{owner.__name__}.{attr}", f"has sha256 {digest}")
    if pysyncobj_syncobj.createJournal is not pysyncobj_journal.createJournal:
        raise _mismatch("pysyncobj.syncobj.createJournal", "is not pysyncobj.journal.createJournal")
    originals: dict[str, types.FunctionType] = {}
    patched: dict[str, types.FunctionType] = {}
    for patch in _METHOD_PATCHES:
        original = vars(pysyncobj_syncobj.SyncObj)[patch.attr]
        originals[patch.name] = original
        patched[patch.name] = _build(patch, original)
    return originals, patched


# Runs at import: a mismatching pysyncobj fails here, before any node starts.
_ORIGINALS, _PATCHED = _load()
_active: set[str] = set()


def apply_patches(*, pickle5: bool = True, large_command: bool = True, append_entries: bool = True,
                  prevote: bool = True, journal_sync: bool = True, stale_snapshot: bool = True) -> None:
    """Switch each patch on (True) or back to stock pysyncobj (False); idempotent, process-wide.

    Affects ``SyncObj`` instances created afterwards. Every node of a cluster should run the same set.
    ``prevote``, ``journal_sync`` and ``stale_snapshot`` are read by ``raft._RaftNode`` when it is built.
    """
    wanted = {"pickle5": pickle5, "large_command": large_command, "append_entries": append_entries,
              "prevote": prevote, "journal_sync": journal_sync, "stale_snapshot": stale_snapshot}
    protocol = PATCHED_PICKLE_PROTOCOL if pickle5 else _STOCK_PICKLE_PROTOCOL
    pysyncobj_pickle.__dict__["__protocol"] = protocol  # the module global is literally "__protocol"
    for patch in _METHOD_PATCHES:
        chosen = _PATCHED if wanted[patch.name] else _ORIGINALS
        setattr(pysyncobj_syncobj.SyncObj, patch.attr, chosen[patch.name])
    _active.clear()
    _active.update(name for name, on in wanted.items() if on)


def patches_off_from_env(environ: dict[str, str] | None = None) -> frozenset[str]:
    """The patch names listed in ``RAFTBROKER_PYSYNCOBJ_PATCHES_OFF`` (unknown names are an error)."""
    raw = (os.environ if environ is None else environ).get(ENV_PATCHES_OFF, "")
    names = frozenset(part.strip() for part in raw.split(",") if part.strip())
    unknown = names - set(PATCH_NAMES)
    if unknown:
        raise ValueError(f"{ENV_PATCHES_OFF}: unknown patch names {sorted(unknown)}; known: {PATCH_NAMES}")
    return names


def apply_patches_from_env() -> None:
    """Apply every patch except those named in ``RAFTBROKER_PYSYNCOBJ_PATCHES_OFF``."""
    off = patches_off_from_env()
    apply_patches(**{name: name not in off for name in PATCH_NAMES})


def active_patches() -> frozenset[str]:
    """The names of the patches currently switched on."""
    return frozenset(_active)


def pickle_protocol() -> int:
    """The pickle protocol pysyncobj currently uses for commands, log entries and messages."""
    protocol = pysyncobj_pickle.__dict__["__protocol"]
    assert isinstance(protocol, int)
    return protocol


# -- the journal hook ------------------------------------------------------------------------------
# SyncObj.__init__ calls the module global ``createJournal(conf.journalFile)``. A node registers a
# factory for its journal path just before it is built; any other path gets pysyncobj's journal.
_STOCK_CREATE_JOURNAL = pysyncobj_journal.createJournal
_journal_factories: dict[str, Callable[[], object]] = {}
_journal_lock = threading.Lock()


def _create_journal(journalFile: str | None = None) -> object:  # noqa: N803 (pysyncobj's name)
    with _journal_lock:
        factory = _journal_factories.pop(journalFile, None) if journalFile else None
    return factory() if factory is not None else _STOCK_CREATE_JOURNAL(journalFile)


def register_journal(path: str, factory: Callable[[], object]) -> None:
    """The next SyncObj built with ``journalFile=path`` gets ``factory()`` as its journal."""
    with _journal_lock:
        _journal_factories[path] = factory


def forget_journal(path: str) -> None:
    """Drop an unused registration (the node failed before building its journal)."""
    with _journal_lock:
        _journal_factories.pop(path, None)


pysyncobj_syncobj.createJournal = _create_journal


# -- the transmission hook -------------------------------------------------------------------------
# Serializer.getTransmissionData opens the dump with the module global ``open(fileName, 'rb')`` when
# a follower needs a snapshot. A node registers an opener for its dump path: it hands pysyncobj a
# file-like object that makes the full snapshot as it is read (snapshot.SnapshotCodec). Any other
# call (the incoming transmission's file, other paths) gets the builtin open.
_transmission_openers: dict[str, Callable[[], object]] = {}


def _serializer_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    if mode == "rb" and not args and not kwargs and isinstance(file, str):
        opener = _transmission_openers.get(file)
        if opener is not None:
            return opener()
    return builtins.open(file, mode, *args, **kwargs)


def register_transmission_opener(dump_file: str, opener: Callable[[], object]) -> None:
    """Transmissions of the dump ``dump_file`` read what ``opener()`` returns."""
    _transmission_openers[dump_file] = opener


def forget_transmission_opener(dump_file: str) -> None:
    _transmission_openers.pop(dump_file, None)


pysyncobj_serializer.open = _serializer_open
