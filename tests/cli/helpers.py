"""The CLI driven in-process (typer's runner) against a real cluster: shared by the CLI tests."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner, Result

from broker.cli.main import app

runner = CliRunner()


def cli(bootstrap: str, *args: str, input: str | bytes | None = None, expect: int = 0) -> Result:
    """Run ``raftbroker --bootstrap B ARGS``; assert the exit code and that nothing crashed."""
    result = runner.invoke(app, ["--bootstrap", bootstrap, *args], input=input)
    assert result.exit_code == expect, f"exit {result.exit_code}: {result.output}"
    assert "Traceback" not in result.output
    return result


def json_lines(result: Result) -> list[dict[str, Any]]:
    """One JSON object per non-empty line of stdout."""
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
