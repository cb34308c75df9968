"""Micro-benchmark of one log compaction's snapshot and of sending it, for a RocksDB store of
``--mib`` MiB of 1 KiB random values (``--rounds`` rounds, each on a fresh checkpoint).

- **packed**: the store's checkpoint packed into a full tar, as every compaction did until
  2026-11-27 (``snapshot.pack``: read, CRC-32 and write of every state file, fsynced).
- **kept**: what a compaction does now (``SnapshotCodec.write`` in synchronous mode): the
  checkpoint kept under ``snapshots/``, its files fsynced, a small dump naming it.
- **send**: reading the packed tar to its end, against reading the full snapshot that
  ``SnapshotCodec.open_for_transmission`` makes from the kept checkpoint (the CRCs are computed
  there now).

Wall milliseconds, and the process's CPU seconds for the two snapshot forms. Compare figures taken
in the same period; a loaded machine inflates the wall times most.

    .venv/bin/python -m bench.snapshot_cost                 # 300 MiB, 3 rounds
    .venv/bin/python -m bench.snapshot_cost --mib 1000 --rounds 2 --dir /var/tmp
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from broker.replication import snapshot
from broker.storage import Column
from broker.storage.rocks import RocksStore

VALUE_BYTES = 1024
_READ_CHUNK = 1 << 20


class _StoreOnly:
    """The two StateMachine calls a snapshot write makes, over a bare store."""

    def __init__(self, store: RocksStore) -> None:
        self._store = store

    def write_snapshot(self, directory: str) -> None:
        self._store.checkpoint(directory)

    def applied_index(self) -> int:
        return 0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fill(store: RocksStore, mib: int) -> None:
    for i in range(mib):
        values = os.urandom(VALUE_BYTES * 1024)  # incompressible, as the bench's payloads
        batch = store.batch()
        for j in range(1024):
            batch.put(Column.RECORDS, i.to_bytes(4, "big") + j.to_bytes(4, "big"),
                      values[j * VALUE_BYTES:(j + 1) * VALUE_BYTES])
        store.write(batch, wal=False)


def one_round(store: RocksStore, root: Path, index: int) -> dict[str, float]:
    raft_data: tuple[object, ...] = ((b"", index, 1), (b"", index - 1, 1), set())
    started, cpu = time.monotonic(), _cpu_s()
    store.checkpoint(str(root / "packed-state"))
    packed = root / "packed.tar"
    snapshot.pack(root / "packed-state", raft_data, packed)
    packed_ms, packed_cpu = (time.monotonic() - started) * 1e3, _cpu_s() - cpu

    node = root / "node"
    codec = snapshot.SnapshotCodec(_StoreOnly(store), node / "work", node / "raft.snapshot",  # type: ignore[arg-type]
                                   background=False)
    started, cpu = time.monotonic(), _cpu_s()
    codec.write(str(node / "raft.snapshot"), raft_data)
    kept_ms, kept_cpu = (time.monotonic() - started) * 1e3, _cpu_s() - cpu

    started = time.monotonic()
    with open(packed, "rb") as f:
        while f.read(_READ_CHUNK):
            pass
    read_packed_ms = (time.monotonic() - started) * 1e3
    started = time.monotonic()
    reader = codec.open_for_transmission(str(node / "raft.snapshot"))
    sent = 0
    while chunk := reader.read(_READ_CHUNK):
        sent += len(chunk)
    stream_ms = (time.monotonic() - started) * 1e3
    return {"packed_ms": round(packed_ms), "packed_cpu_s": round(packed_cpu, 2), "kept_ms": round(kept_ms),
            "kept_cpu_s": round(kept_cpu, 2), "send_packed_ms": round(read_packed_ms),
            "send_streamed_ms": round(stream_ms), "snapshot_mib": round(sent / 2**20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=300, help="store size in MiB of 1 KiB values")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to put the store (default: the temp directory)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="snapshot-cost-", dir=args.dir))
    try:
        store = RocksStore(base / "store")
        try:
            fill(store, args.mib)
            for n in range(args.rounds):
                root = base / f"round-{n}"
                root.mkdir()
                print(json.dumps({"round": n, **one_round(store, root, n + 2)}))
                shutil.rmtree(root)
        finally:
            store.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
