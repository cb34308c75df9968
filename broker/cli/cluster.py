"""``raftbroker cluster status|add-node|remove-node``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from broker.cli import render
from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state

app = typer.Typer(help="Inspect the cluster and change its members.", no_args_is_help=True)


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


@app.command("add-node")
def add_node(
    ctx: typer.Context,
    node_id: Annotated[str, typer.Argument(metavar="ID", help="The new node's id (as given to its --node-id).")],
    raft: Annotated[str, typer.Argument(metavar="RAFT", help="Its Raft address, host:port.")],
    grpc_address: Annotated[str, typer.Argument(metavar="GRPC", help="Its gRPC address, host:port.")],
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Add a running node to the cluster. Start it first with every current member as --peer; it
    catches up from the leader's snapshot and log. One change at a time."""
    with connect(ctx) as client:
        client.add_node(node_id, raft, grpc_address)
    if state(ctx).json:
        emit_json({"added": node_id, "raft_address": raft, "grpc_address": grpc_address})
    else:
        Console().print(f"node {node_id} is a member ({raft}, gRPC {grpc_address})")


@app.command("remove-node")
def remove_node(
    ctx: typer.Context,
    node_id: Annotated[str, typer.Argument(metavar="ID", help="The member to remove.")],
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Remove a member (a leader hands leadership over first); stop its process afterwards."""
    with connect(ctx) as client:
        client.remove_node(node_id)
    if state(ctx).json:
        emit_json({"removed": node_id})
    else:
        Console().print(f"node {node_id} is no longer a member; stop its process")
