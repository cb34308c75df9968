"""``python -m chaos drill SCENARIO --seed N`` (the same command as ``raftbroker drill``),
``python -m chaos check HISTORY.jsonl`` and ``python -m chaos cleanup``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from chaos.cli import register

app = typer.Typer(name="chaos", help="raftbroker chaos and failover drills.", no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
register(app)


@app.command("check")
def check_command(
    history: Annotated[Path, typer.Argument(help="A drill's history.jsonl")],
    json_: Annotated[bool, typer.Option("--json", help="Print the JSON report")] = False,
) -> None:
    """Check a recorded history again (e.g. after changing the checker); exit 1 on violations."""
    from chaos.checkers import check
    from chaos.history import load

    report = check(load(history))
    print(json.dumps(report.to_json(), indent=2) if json_ else report.table())
    if report.violation_count:
        raise typer.Exit(1)


@app.command("cleanup")
def cleanup_command(
    run_id: Annotated[str | None, typer.Option(help="Only this run's (6 hex digits); default: every drill's")] = None,
) -> None:
    """Remove network namespaces and links a killed drill left behind (and the nodes inside them)."""
    from chaos.net import netns_unavailable
    from chaos.net.netns import cleanup_all

    why = netns_unavailable()
    if why is not None:
        print(f"nothing to clean: network namespaces are not used here ({why})")
        return
    removed = cleanup_all(run_id)
    print("removed: " + (", ".join(removed) if removed else "nothing"))


if __name__ == "__main__":
    app(prog_name="python -m chaos")
