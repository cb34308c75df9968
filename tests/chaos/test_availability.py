"""A chaos test that cannot inject its fault skips on a developer's machine and fails under `make chaos`."""

from __future__ import annotations

import pytest

from tests.chaos import availability

pytestmark = [pytest.mark.unit]


def test_without_strict_a_missing_fault_is_a_skip_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(availability.STRICT_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no ip netns"):
        availability.unavailable("no ip netns")


def test_under_make_chaos_a_missing_fault_fails_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(availability.STRICT_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="could not run: no ip netns"):
        availability.unavailable("no ip netns")


def test_make_chaos_sets_strict_for_every_drill_target() -> None:
    from pathlib import Path

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    runs = [line for line in makefile.splitlines() if "pytest -m chaos" in line]
    assert runs and all(f"{availability.STRICT_ENV}=1" in line for line in runs), runs
