"""RocksStore reports damaged files instead of ending reads silently (issue 11, item 7)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import grpc
import pytest

from broker.services.errors import abort
from broker.storage import Column, StoreCorruption
from broker.storage.rocks import RocksStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

KEYS = 20_000


def _damaged_store(root: Path) -> Path:
    store = RocksStore(root)
    batch = store.batch()
    for i in range(KEYS):
        batch.put(Column.RECORDS, i.to_bytes(8, "big"), os.urandom(100))
    store.write(batch)
    store.close()  # flushes into an SST
    sst = max(root.glob("db-*/*.sst"), key=lambda p: p.stat().st_size)
    with open(sst, "r+b") as f:
        f.seek(sst.stat().st_size // 2)
        f.write(b"\xff" * 64)
    return sst


def test_a_scan_over_a_damaged_block_raises_naming_the_file(tmp_path: Path) -> None:
    sst = _damaged_store(tmp_path)
    store = RocksStore(tmp_path)
    try:
        seen = 0
        with pytest.raises(StoreCorruption, match=rf"column records .*Corruption.*{sst.name}"):
            for _ in store.scan(Column.RECORDS, b"", b"\xff" * 9):
                seen += 1
        assert 0 < seen < KEYS
        assert list(store.scan(Column.RECORDS, b"", (10).to_bytes(8, "big"))) != [], "undamaged ranges still read"
    finally:
        store.close()


@pytest.mark.parametrize("content", [b"\x00garbage", b"", b"-1", b"9"])
def test_a_damaged_current_file_is_refused_with_what_to_do(tmp_path: Path, content: bytes) -> None:
    RocksStore(tmp_path).close()
    (tmp_path / "CURRENT").write_bytes(content)
    with pytest.raises(StoreCorruption, match=r"CURRENT is damaged.*present: db-0.*move the store directory"):
        RocksStore(tmp_path)


class _Context:
    """Stands in for grpc's ServicerContext (not one of our components): records the abort."""

    def set_trailing_metadata(self, metadata: object) -> None:
        self.trailers = metadata

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise RuntimeError(code, details)


def test_a_store_corruption_anywhere_becomes_data_loss() -> None:
    with pytest.raises(RuntimeError) as info:
        abort(_Context(), StoreCorruption("column groups of /x/db-0: Corruption: bad block in /x/db-0/000009.sst"))
    code, details = info.value.args
    assert code is grpc.StatusCode.DATA_LOSS and "000009.sst" in details and "another node" in details
