"""``drill`` through its ``register`` hook (chaos/cli.py), on an app built here; how it reaches the
broker's CLI (the ``raftbroker.commands`` entry point) and ``python -m chaos`` are tested at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from chaos.cli import register
from chaos.scenarios import SCENARIOS, Scenario
from tests.conftest import processes_naming

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


# -- how drill is reached: the entry point, python -m chaos, and without chaos ----------------------
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.unit
def test_the_broker_cli_gets_drill_from_the_installed_entry_point(unavailable: str) -> None:
    from importlib.metadata import entry_points

    from broker.cli.main import PLUGIN_GROUP, app

    assert ("drill", "chaos.cli:register") in [(e.name, e.value) for e in entry_points(group=PLUGIN_GROUP)]
    result = CliRunner().invoke(app, ["--json", "drill", unavailable])  # the global --json reaches the drill
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["available"] is False
    assert CliRunner().invoke(app, ["drill", "meteor-strike"]).exit_code == 2


@pytest.mark.unit
def test_python_dash_m_chaos_runs_drill() -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "chaos", "drill", "meteor-strike"], cwd=REPO, capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and "unknown scenario" in result.stderr, result.stdout + result.stderr


@pytest.mark.unit
def test_an_entry_point_whose_package_is_missing_says_so_and_exits_2() -> None:
    from importlib.metadata import EntryPoint

    from broker.cli.main import PLUGIN_GROUP, register_plugins

    app = _app_without_drill()
    register_plugins(app, [EntryPoint("drill", "no_such_package_here.cli:register", PLUGIN_GROUP)])
    result = CliRunner().invoke(app, ["drill", "kill-leader", "--seed", "3"])
    assert result.exit_code == 2, result.output
    assert "`no_such_package_here` package, which is not installed" in result.stderr
    assert "runs from a checkout of the repository" in result.stderr and "Traceback" not in result.output


@pytest.mark.unit
def test_chaos_imports_no_broker_cli_and_broker_no_chaos() -> None:
    import ast

    def imports(path: Path) -> set[str]:
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.add(node.module)
        return out

    wrong = [f"{p.relative_to(REPO)}: {m}" for p in (REPO / "chaos").rglob("*.py") for m in imports(p)
             if m == "broker.cli" or m.startswith("broker.cli.")]
    wrong += [f"{p.relative_to(REPO)}: {m}" for p in (REPO / "broker").rglob("*.py") for m in imports(p)
              if m == "chaos" or m.startswith("chaos.")]
    assert not wrong, wrong
    assert "sys.path" not in (REPO / "broker" / "cli" / "main.py").read_text()


def _app_without_drill() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Test app."""

    return app


# -- interrupted and refused runs -------------------------------------------------------------------
@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_sigterm_mid_drill_removes_its_nodes_and_network_and_exits_143(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    from chaos.net import netns_unavailable
    from chaos.net.netns import leftovers

    out = tmp_path / "d"
    with open(tmp_path / "drill.out", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "chaos", "drill", "kill-leader", "--seed", "3", "--duration",
                                 "120", "--out", str(out)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        history = out / "history.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and '"f":"fault"' not in (history.read_text() if history.exists() else ""):
            time.sleep(0.2)
        run = json.loads(history.read_text().splitlines()[0])["value"]
        nodes = [pid for pid in processes_naming(out / "cluster") if pid != proc.pid]
        assert len(nodes) >= 2, (tmp_path / "drill.out").read_text()  # mid-fault: the killed leader may be down
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 128 + signal.SIGTERM, (tmp_path / "drill.out").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "interrupted (SIGTERM)" in (tmp_path / "drill.out").read_text()
    assert processes_naming(out / "cluster") == []
    if netns_unavailable() is None:
        assert [n for n in leftovers() if run["run_id"] in n] == []


@pytest.mark.unit
@pytest.mark.parametrize("args", [["--network", "ethernet"], ["--out", "{used}"], ["--out", "{file}"]])
def test_a_bad_network_or_a_used_out_directory_is_a_usage_error_and_starts_nothing(
        args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import chaos.drill

    def run_drill(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the drill started")

    monkeypatch.setattr(chaos.drill, "run_drill", run_drill)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "history.jsonl").write_text("{}\n")  # an earlier run's
    (tmp_path / "file").write_text("")
    args = [a.format(used=tmp_path / "used", file=tmp_path / "file") for a in args]
    result = CliRunner().invoke(_app(), ["drill", "kill-leader", "--seed", "3", *args])
    assert result.exit_code == 2, result.output
    assert "'--network'" in result.output or "'--out'" in result.output
