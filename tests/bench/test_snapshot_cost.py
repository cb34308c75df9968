"""``bench.snapshot_cost`` measures what it says on a small store (it must keep working as the code moves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import snapshot_cost
from broker.storage.rocks import RocksStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_one_round_packs_keeps_and_sends_the_whole_store(tmp_path: Path) -> None:
    store = RocksStore(tmp_path / "store")
    try:
        snapshot_cost.fill(store, 3)
        (tmp_path / "round").mkdir()
        figures = snapshot_cost.one_round(store, tmp_path / "round", 2)
    finally:
        store.close()
    assert figures["snapshot_mib"] == 3, figures  # incompressible values: the full snapshot is the store
    assert set(figures) == {"packed_ms", "packed_cpu_s", "kept_ms", "kept_cpu_s", "send_packed_ms",
                            "send_streamed_ms", "snapshot_mib"}
