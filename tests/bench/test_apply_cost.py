"""``bench.apply_cost`` measures the apply of real commands (it must keep working as the code moves)."""

from __future__ import annotations

import time

import pytest

from bench import apply_cost

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

_FIGURES = {"wall_us_per_record", "wall_us_per_record_min", "cpu_us_per_record", "cpu_us_per_record_min"}


@pytest.mark.parametrize("store_wal", [True, False])
def test_applies_every_command_and_reports_per_record_figures(store_wal: bool) -> None:
    figures = apply_cost.measure(records=10, size_bytes=100, rounds=5, seed=1, store_wal=store_wal)
    assert set(figures) == _FIGURES
    assert all(value > 0 for value in figures.values()), figures


def test_idle_sleeps_before_each_apply_and_is_not_measured() -> None:
    rounds, idle_s = 20, 0.02
    started = time.perf_counter()
    figures = apply_cost.measure(records=1, size_bytes=100, rounds=rounds, seed=1, store_wal=False, idle_s=idle_s)
    elapsed = time.perf_counter() - started
    assert elapsed >= (apply_cost.WARMUP_APPLIES + rounds) * idle_s  # it slept before every apply
    assert figures["wall_us_per_record_min"] < idle_s * 1e6  # and the sleep is outside the figures
