"""``raftbroker cluster status|formats|verify|add-node|remove-node``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from broker.cli import render
from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state

if TYPE_CHECKING:  # annotations only: the SDK is imported when a command runs (broker/cli/context.py)
    from broker.client import ClusterStatus

app = typer.Typer(help="Inspect the cluster and change its members.", no_args_is_help=True)


@app.command("status")
def status(ctx: typer.Context, json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Every node: id, address, role, term, commit and applied index, pid, reachable.

    --json: {"leader_id", "nodes": [{"id", "address", "role", "term", "commit_index",
    "applied_index", "pid", "reachable", "leader_id", "apply_format", "cluster_format"}]}.
    """
    _show_status(ctx, render.status_json, render.print_status)


@app.command("formats")
def formats(ctx: typer.Context, json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Command formats (docs/design/command-formats.md): the newest each node's code applies, the
    cluster's, and what holds it back. The leader raises the cluster's format, within a
    housekeeping period, once every member applies a newer one (unless hold_command_format is set).

    --json: {"cluster_format", "members_apply" (the lowest format every reachable node applies, null
    when a node does not answer), "held_by": [ids], "nodes": [{"id", "apply_format",
    "cluster_format", "reachable"}]}.
    """
    _show_status(ctx, render.formats_json, render.print_formats)


EXIT_DIFFERING = 3  # cluster verify: some member applied the log differently
EXIT_INCOMPLETE = 4  # cluster verify: not every member gave a digest


@app.command("verify")
def verify(ctx: typer.Context, json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Compare every member's digest of apply outcomes at the lowest index all of them have applied:
    a member whose digest differs decided some command differently (most often: it runs different
    code). Digests begin when the cluster's command format reaches 2.

    Exit code: 0 when every member agrees, 3 when some differ (named), 4 when not every member gave
    a digest (not answering, or keeping none yet), 1 when the question could not be asked.

    --json: {"index", "agreed", "differing": [ids], "nodes": [{"id", "reachable", "digest" (8 hex
    digits, null when none), "error"}]}.
    """
    with connect(ctx) as client:
        found = client.verify_replicas()
    if state(ctx).json:
        emit_json(render.verify_json(found))
    else:
        render.print_verify(Console(), found)
    if found.differing:
        raise typer.Exit(EXIT_DIFFERING)
    if not found.agreed:
        raise typer.Exit(EXIT_INCOMPLETE)


def _show_status(ctx: typer.Context, as_json: Callable[[ClusterStatus], dict[str, Any]],
                 show: Callable[[Console, ClusterStatus], None]) -> None:
    with connect(ctx) as client:
        result = client.cluster_status()
    if state(ctx).json:
        emit_json(as_json(result))
    else:
        show(Console(), result)


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
