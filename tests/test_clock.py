"""The node clock: wall time plus an offset, driven by a file in tests and drills."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from broker.clock import ENV_CLOCK_FILE, Clock, ManualClock, NodeClock

pytestmark = pytest.mark.unit


def test_the_production_clock_is_the_wall_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CLOCK_FILE, raising=False)
    clock = NodeClock.from_env()
    clock.start()  # nothing to watch: no thread
    before = int(time.time() * 1000)
    assert before <= clock.now_ms() <= int(time.time() * 1000)
    assert clock.offset_ms == 0
    clock.stop()


def test_the_file_sets_the_offset_at_once_and_a_missing_or_empty_file_is_zero(tmp_path: Path) -> None:
    path = tmp_path / "clock_offset_ms"
    path.write_text("-300000\n")
    clock = NodeClock(offset_file=path)
    assert clock.offset_ms == -300000
    assert abs(clock.now_ms() - (int(time.time() * 1000) - 300000)) < 1000
    path.write_text("")
    clock.poll()
    assert clock.offset_ms == 0
    path.write_text("42")
    clock.poll()
    path.unlink()
    clock.poll()
    assert clock.offset_ms == 0


def test_a_bad_value_is_logged_once_and_keeps_the_offset(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "clock_offset_ms"
    path.write_text("1500")
    clock = NodeClock(offset_file=path)
    path.write_text("ten minutes")
    with caplog.at_level(logging.WARNING, logger="broker.clock"):
        clock.poll()
        clock.poll()
    assert clock.offset_ms == 1500
    assert [r.getMessage() for r in caplog.records if "bad offset" in r.getMessage()] == [
        f"clock file {path}: bad offset 'ten minutes' (keeping +1500 ms)"]


def test_the_watcher_follows_the_file_and_logs_each_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "clock_offset_ms"
    monkeypatch.setenv(ENV_CLOCK_FILE, str(path))
    clock = NodeClock.from_env()
    with caplog.at_level(logging.INFO, logger="broker.clock"):
        clock.start()
        try:
            path.write_text("300000")
            deadline = time.monotonic() + 5
            while clock.offset_ms != 300000 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert clock.offset_ms == 300000
        finally:
            clock.stop()
    assert "clock offset now +300000 ms" in [r.getMessage() for r in caplog.records]



def test_an_offset_moves_the_wall_reading_and_not_the_monotonic_one() -> None:
    clock: Clock = NodeClock(offset_ms=-600_000)
    before = int(time.monotonic() * 1000)
    assert clock.now_ms() <= int(time.time() * 1000) - 600_000
    assert before <= clock.monotonic_ms() <= int(time.monotonic() * 1000)


def test_a_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(wall_ms=10_000, mono_ms=5)
    assert (clock.now_ms(), clock.monotonic_ms()) == (10_000, 5)
    clock.advance(100)
    assert (clock.now_ms(), clock.monotonic_ms()) == (10_100, 105)
    clock.step_wall(-10_000)  # a jump back: the monotonic reading stays
    assert (clock.now_ms(), clock.monotonic_ms()) == (100, 105)
    with pytest.raises(ValueError, match="does not pass backwards"):
        clock.advance(-1)
