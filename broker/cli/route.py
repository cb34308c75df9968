"""``raftbroker route create|list|delete``: server-side copies between topics and clusters (SPEC §3.4).

JSON shape of a route (``route list --json`` prints an array of them): ``{"name", "source",
"target", "target_cluster" (list of addresses, empty: this cluster), "filter", "partition_key",
"ops", "route_id", "created_ms", "lag", "copied", "skipped", "lost" (of skipped: deleted before
routed, unreadable, refused by the target), "last_error", "partitions":
[{"partition", "next_offset", "end_offset"}]}``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, parse_bootstrap, state

if TYPE_CHECKING:  # annotations only: the SDK is imported when a command runs (broker/cli/context.py)
    from broker.client import RouteInfo

# the SDK's broker.client.models.OPS, written out so that the help does not import the SDK (a unit test compares)
OPS_TEXT = "insert, update, delete, tombstone"

app = typer.Typer(help="Copy matching records of a topic into another topic, here or in another cluster.",
                  no_args_is_help=True)


def route_json(info: RouteInfo) -> dict[str, Any]:
    return {
        "name": info.name, "source": info.source, "target": info.target,
        "target_cluster": list(info.target_cluster), "filter": info.filter, "partition_key": info.partition_key,
        "ops": list(info.ops), "route_id": info.route_id, "created_ms": info.created_ms, "lag": info.lag,
        "copied": info.copied, "skipped": info.skipped, "lost": info.lost, "last_error": info.last_error,
        "partitions": [{"partition": p.partition, "next_offset": p.next_offset, "end_offset": p.end_offset}
                       for p in info.partitions],
    }


def parse_ops(text: str | None) -> list[str] | None:
    """``insert,update`` as a list; raises ``typer.BadParameter`` for an unknown op."""
    if text is None:
        return None
    from broker.client.models import OPS

    ops = [o.strip().lower() for o in text.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        raise typer.BadParameter(f"use a comma-separated list of {', '.join(OPS)}", param_hint="--op")
    return ops


@app.command("create")
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Route name: 1-249 of A-Z a-z 0-9 . _ -")],
    source: Annotated[str, typer.Option("--from", help="Source topic (this cluster).")],
    target: Annotated[str, typer.Option("--to", help="Target topic.")],
    filter_: Annotated[str | None, typer.Option("--filter", help="Boolean CEL: copy only matching records "
                                                "(variables: key (bytes), headers, op, partition, timestamp_ms, "
                                                "value; see README 'Filters').",
                                                show_default=False)] = None,
    partition_key: Annotated[str | None, typer.Option("--partition-key", help="CEL whose string/bytes/int "
                                                      "result is hashed to pick the target partition "
                                                      "(default: the record's key).", show_default=False)] = None,
    op: Annotated[str | None, typer.Option("--op", help="Copy only these ops: comma-separated "
                                           f"{OPS_TEXT}.", show_default=False)] = None,
    to_cluster: Annotated[str | None, typer.Option("--to-cluster", help="Mirror into another cluster: its node "
                                                   "addresses host:port,... (records that came from that cluster "
                                                   "are never sent back).", show_default=False)] = None,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Create a route: the leader copies every matching record of --from into --to, from the start
    of the retained log, in order per source partition, keeping each record's origin.
    A route that would close a cycle of routes in this cluster is refused."""
    ops = parse_ops(op)
    cluster = list(parse_bootstrap(to_cluster, "--to-cluster")) if to_cluster is not None else None
    with connect(ctx) as client:
        info = client.create_route(name, source, target, filter=filter_, partition_key=partition_key, ops=ops,
                                   target_cluster=cluster)
    if state(ctx).json:
        emit_json(route_json(info))
    else:
        where = f" on {','.join(info.target_cluster)}" if info.target_cluster else ""
        Console().print(f"created route {info.name}: {info.source} -> {info.target}{where}")


@app.command("list")
def list_(ctx: typer.Context, json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Every route with its lag (source records not routed yet) and the leader's counts."""
    with connect(ctx) as client:
        routes = client.list_routes()
    if state(ctx).json:
        emit_json([route_json(r) for r in routes])
        return
    if not routes:
        Console().print("no routes")
        return
    table = Table("name", "from", "to", "filter", "partition key", "ops", "lag", "copied", "skipped", "lost",
                  "last error", box=None)
    for r in routes:
        target = r.target + (f" @ {','.join(r.target_cluster)}" if r.target_cluster else "")
        table.add_row(r.name, r.source, target, r.filter or "-", r.partition_key or "-", ",".join(r.ops) or "all",
                      str(r.lag), str(r.copied), str(r.skipped), str(r.lost), r.last_error or "-")
    Console(width=200).print(table)


@app.command("delete")
def delete(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Route name.")],
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Delete a route (copies already made stay). --json: {"deleted": NAME}."""
    with connect(ctx) as client:
        client.delete_route(name)
    if state(ctx).json:
        emit_json({"deleted": name})
    else:
        Console().print(f"deleted route {name}")
