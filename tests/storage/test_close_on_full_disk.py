"""Closing the store on a full disk (docs/operations.md, "A full disk"): the memtables' flush fails;
the close must log it and still close everything, not raise (a node stopped with SIGTERM on a full
disk exited 1 with a traceback from ``RocksStore.close``, and left the database open)."""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.storage import Column
from broker.storage.rocks import RocksStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """An 8 MiB tmpfs under /tmp/walk-disk (needs root to mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs to fill needs root")
    mount = Path("/tmp/walk-disk") / f"close-{uuid.uuid4().hex[:8]}"
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
        mount.rmdir()


def test_closing_the_store_on_a_full_disk_logs_and_closes(small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = RocksStore(small_disk / "store")
    batch = store.batch()
    for i in range(1000):  # ~1 MB in the memtable, written without the WAL as applies are
        batch.put(Column.RECORDS, i.to_bytes(8, "big"), os.urandom(1000))
    store.write(batch, wal=False)
    free = os.statvfs(small_disk)
    subprocess.run(["fallocate", "-l", str(free.f_bavail * free.f_frsize), str(small_disk / "ballast")], check=True)
    with caplog.at_level(logging.ERROR, logger="broker.storage.rocks"):
        store.close()  # the flush fails with ENOSPC
    assert any("could not flush" in r.getMessage() and "No space left on device" in r.getMessage()
               for r in caplog.records), caplog.text
    (small_disk / "ballast").unlink()
    again = RocksStore(small_disk / "store")  # closed for real: its LOCK is free in this very process
    again.close()
