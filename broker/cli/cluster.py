"""``raftbroker cluster status``."""

from __future__ import annotations

import typer
from rich.console import Console

from broker.cli import render
from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state

app = typer.Typer(help="Inspect the cluster.", no_args_is_help=True)


@app.command("status")
def status(ctx: typer.Context, json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Every node: id, address, role, term, commit and applied index, pid, reachable.

    --json: {"leader_id", "nodes": [{"id", "address", "role", "term", "commit_index",
    "applied_index", "pid", "reachable", "leader_id"}]}.
    """
    with connect(ctx) as client:
        result = client.cluster_status()
    if state(ctx).json:
        emit_json(render.status_json(result))
    else:
        render.print_status(Console(), result)
