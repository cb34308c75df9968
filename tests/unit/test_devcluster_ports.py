"""DevCluster's ports stay out of the kernel's ephemeral range (where outgoing connections take theirs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import devcluster
from broker.devcluster import HTTP_PORT_OFFSET, NODES_ADDED_MAX, ephemeral_port_low, free_base_port

pytestmark = pytest.mark.unit


def test_every_port_of_a_cluster_and_of_its_added_nodes_is_below_the_ephemeral_range() -> None:
    low = ephemeral_port_low()
    assert low > 1024
    for nodes in (1, 3, 5):
        for _ in range(50):
            base = free_base_port(nodes)
            assert base + HTTP_PORT_OFFSET + nodes + NODES_ADDED_MAX <= low, (base, low)


def test_an_unreadable_range_falls_back_to_linux_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(devcluster, "_EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ephemeral_port_low() == 32768
