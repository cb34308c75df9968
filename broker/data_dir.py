"""A node's data directory before anything opens it: writable, and this node's own.

The directory holds the Raft journal (``raft/``: the log, the current term and the vote) and the
store (``store/``). Raft's safety rests on each member keeping *its own* log and vote: a node started
on another member's directory (a swapped volume, a copy-paste in a unit file) would answer votes and
appends with a log and a vote that are not its own, and can make a committed entry vanish from a
majority, i.e. lose acknowledged records. So the directory records whose it is, and a start as
anyone else is refused before Raft or the store opens.

``<data_dir>/identity.json`` (written once, atomically: temporary file, fsync, rename, fsync of the
directory)::

    {"format": 1, "cluster_id": "prod", "node_id": "n2", "created_ms": 1764547200000}

- No file (a new directory, or one written by a version before identities): the node records its
  own identity and starts.
- The file names this node and cluster: it starts.
- It names another node or cluster: the start is refused (:class:`DataDirNotOurs`, exit 2: the data
  is fine, the setting is wrong), naming both and what to do.
- ``adopt_data_dir`` (``--adopt-data-dir``) takes a copy over as this node's (restoring a backup as a
  new cluster, docs/deploy.md "Back up and restore"). That is only safe for a node started alone,
  whose log and vote nobody else counts on, so with peers configured it is refused as well. A
  directory that already is this node's is unaffected, so the setting may stay on.
- A file that cannot be read or parsed: :class:`DataDirIdentityDamaged` (exit 3, as for other
  damaged data), naming the file.

Adopting also leaves ``<data_dir>/restoring`` (:data:`RESTORING_FILE`): the copy's Raft snapshot
and journal still name the old cluster's members, who are not there, and a node that counted them
would never have a majority. While the file is there a node started alone takes itself as the only
member, whatever that history says (``broker.replication.raft_node``), until its first snapshot
holds the new configuration; then the file is removed (:func:`restored`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

IDENTITY_FILE = "identity.json"
RESTORING_FILE = "restoring"
IDENTITY_FORMAT = 1
_PROBE = ".raftbroker-write-probe"


class DataDirUnusable(Exception):
    """The data directory cannot be used as it is (it cannot be created or written: a read-only
    mount, a path through a file, permissions; or it is another node's): ``raftbroker serve`` says
    so in one line and exits 2, before anything starts."""


class DataDirNotOurs(DataDirUnusable):
    """The data directory's identity names another node or cluster (and it was not adopted)."""


class DataDirIdentityDamaged(Exception):
    """``identity.json`` exists but cannot be read as an identity: ``raftbroker serve`` refuses to
    start with exit 3, as for other damaged data."""


@dataclass(frozen=True)
class Identity:
    """Whose a data directory is."""

    cluster_id: str
    node_id: str

    def __str__(self) -> str:
        return f"node {self.node_id!r} of cluster {self.cluster_id!r}"


def check_writable(data_dir: Path) -> None:
    """Create ``data_dir`` if missing and make sure this process can write there."""
    probe = data_dir / _PROBE
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise DataDirUnusable(f"data directory {data_dir}: {exc.strerror or exc} (the node keeps its Raft journal "
                              "and store there: check the path, the volume's mount and its permissions)") from None


def read_identity(data_dir: Path) -> Identity | None:
    """The identity recorded in ``data_dir``, None when there is none."""
    path = data_dir / IDENTITY_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DataDirIdentityDamaged(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != IDENTITY_FORMAT:
            raise ValueError(f"not an identity of format {IDENTITY_FORMAT}")
        cluster_id, node_id = doc["cluster_id"], doc["node_id"]
        if not isinstance(cluster_id, str) or not isinstance(node_id, str) or not cluster_id or not node_id:
            raise ValueError("cluster_id and node_id must be non-empty strings")
    except (ValueError, KeyError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DataDirIdentityDamaged(
            f"{path}: damaged ({exc}); if this directory is this node's own, remove the file and the node "
            "records its identity again at start") from None
    return Identity(cluster_id, node_id)


def write_identity(data_dir: Path, identity: Identity) -> None:
    """Record ``identity`` in ``data_dir``, durably and atomically."""
    path = data_dir / IDENTITY_FILE
    staging = data_dir / f".{IDENTITY_FILE}.tmp"
    doc = {"format": IDENTITY_FORMAT, "cluster_id": identity.cluster_id, "node_id": identity.node_id,
           "created_ms": int(time.time() * 1000)}
    try:
        with staging.open("wb") as f:
            f.write(json.dumps(doc).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(staging, path)
        fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise DataDirUnusable(f"data directory {data_dir}: cannot record its identity in {IDENTITY_FILE} "
                              f"({exc.strerror or exc})") from None


def claim(data_dir: Path, me: Identity, *, adopt: bool, alone: bool) -> None:
    """Make sure ``data_dir`` is ``me``'s (see the module docstring): record the identity when there
    is none, take a copy over when ``adopt`` and ``alone``, refuse anything else."""
    recorded = read_identity(data_dir)
    if recorded == me:
        return
    if recorded is None:
        holds_data = any((data_dir / sub).exists() for sub in ("raft", "store"))
        write_identity(data_dir, me)
        if holds_data:  # written by a version before identities: from now on it is checked
            log.info("data directory %s: recorded its identity (%s) in %s; a start as another node or cluster "
                     "is refused from now on", data_dir, me, IDENTITY_FILE)
        return
    if adopt and alone:
        log.warning("data directory %s: adopted as %s; it was %s (--adopt-data-dir: a restored copy)",
                    data_dir, me, recorded)
        _write_synced(data_dir, data_dir / RESTORING_FILE, b"")  # the history's end: at the first start
        write_identity(data_dir, me)
        return
    if adopt:
        raise DataDirNotOurs(
            f"data directory {data_dir} belongs to {recorded}, and --adopt-data-dir (adopt_data_dir) takes it "
            f"over only for a node started alone, without peers (a restore): this node, {me}, has peers, who "
            "count on its own Raft log and vote. Start it alone and add members afterwards, or give it its "
            "own data directory")
    renamed = (" If the cluster was renamed on purpose, set cluster_id in that file on every node."
               if recorded.node_id == me.node_id else "")
    raise DataDirNotOurs(
        f"data directory {data_dir} belongs to {recorded}, not to this node, {me} ({data_dir / IDENTITY_FILE}): "
        "another member's Raft log and vote could lose acknowledged records. Point --data-dir at this node's own "
        "directory (or an empty one: it is caught up from the leader); to restore a copy as a new cluster, "
        "start it alone with --adopt-data-dir (docs/deploy.md, 'Back up and restore')." + renamed)


def restoring(data_dir: Path) -> bool:
    """Whether ``data_dir`` is a copy adopted alone whose first snapshot as such is not taken yet."""
    return (data_dir / RESTORING_FILE).exists()


def restore_history_end(data_dir: Path, journal_last_index: int) -> int:
    """The last Raft index of the copy's own history: recorded at the first start after adopting
    (``journal_last_index`` then), read back at a later one (what was appended since is the new
    cluster's, its membership changes included)."""
    path = data_dir / RESTORING_FILE
    try:
        recorded = path.read_text().strip()
    except OSError:
        recorded = ""
    if recorded.isdigit():
        return int(recorded)
    _write_synced(data_dir, path, f"{journal_last_index}\n".encode())
    return journal_last_index


def restored(data_dir: Path) -> None:
    """The adopted copy's own snapshot is taken: its history counts again (see the module)."""
    try:
        (data_dir / RESTORING_FILE).unlink(missing_ok=True)
        _fsync_dir(data_dir)
    except OSError as exc:
        log.warning("data directory %s: cannot remove %s (%s); it is tried again at the next start",
                    data_dir, RESTORING_FILE, exc.strerror or exc)


def _fsync_dir(data_dir: Path) -> None:
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(data_dir: Path, path: Path, content: bytes) -> None:
    try:
        with path.open("wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(data_dir)
    except OSError as exc:
        raise DataDirUnusable(f"data directory {data_dir}: cannot write {path.name} ({exc.strerror or exc})") from None
