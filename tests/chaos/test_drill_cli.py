"""``raftbroker drill`` through its ``register`` hook, on an app built here (main.py wires it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from broker.cli.drill import register
from chaos.scenarios import SCENARIOS, Scenario

UNAVAILABLE = Scenario("no-feature", "a fault whose broker feature does not exist", unavailable="no such feature yet")


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Test app."""

    register(app)
    return app


@pytest.fixture
def unavailable(monkeypatch: pytest.MonkeyPatch) -> str:
    """A scenario that cannot run (every real one can today)."""
    monkeypatch.setitem(SCENARIOS, UNAVAILABLE.name, UNAVAILABLE)
    return UNAVAILABLE.name


@pytest.mark.unit
def test_a_scenario_without_its_feature_says_not_available_and_does_not_fail(unavailable: str) -> None:
    result = CliRunner().invoke(_app(), ["drill", unavailable, "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "not available: no such feature yet" in result.output


@pytest.mark.unit
def test_json_report_has_a_top_level_violations_count(unavailable: str) -> None:
    result = CliRunner().invoke(_app(), ["drill", unavailable, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["violations"] == 0 and doc["available"] is False and doc["scenario"] == unavailable


@pytest.mark.unit
def test_an_unknown_scenario_is_a_usage_error() -> None:
    result = CliRunner().invoke(_app(), ["drill", "meteor-strike"])
    assert result.exit_code == 2
    assert "unknown scenario" in result.output


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_real_drill_prints_seed_schedule_and_table_and_exits_zero(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["drill", "kill-follower", "--seed", "5", "--duration", "6",
                                         "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert "seed=5" in result.output and "schedule: kill(" in result.output
    assert "violations: 0" in result.output
    report = json.loads((tmp_path / "d" / "report.json").read_text())
    assert report["violations"] == 0 and report["operations"]["records_acked"] > 0
    assert (tmp_path / "d" / "history.jsonl").stat().st_size > 0
