"""``raftbroker topic create|list|describe|drop``."""

from __future__ import annotations

import enum
from typing import Annotated

import typer
from rich.console import Console

from broker.cli import render
from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state

app = typer.Typer(help="Create, list, describe and drop topics.", no_args_is_help=True)


class Durability(enum.StrEnum):
    ephemeral = "ephemeral"
    memory = "memory"
    disk = "disk"
    fsync = "fsync"


class FullPolicy(enum.StrEnum):
    discard_old = "discard_old"
    reject = "reject"


@app.command("create")
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name: 1-249 of A-Z a-z 0-9 . _ -")],
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1, help="Number of partitions.")] = 1,
    durability: Annotated[
        Durability | None, typer.Option(help="Durability class (server default: disk).")
    ] = None,
    full_policy: Annotated[
        FullPolicy | None, typer.Option(help="When a retention cap is hit (server default: discard_old).")
    ] = None,
    max_age_ms: Annotated[int | None, typer.Option(min=1, help="Retention: delete records older than this.")] = None,
    max_records: Annotated[int | None, typer.Option(min=1, help="Retention: records kept per partition.")] = None,
    max_bytes: Annotated[int | None, typer.Option(min=1, help="Retention: bytes kept per partition.")] = None,
    dedup_window_ms: Annotated[
        int | None,
        typer.Option(min=-1, help="How long idempotency keys are remembered, in ms; -1: forever "
                     "(server default: 120000).", show_default=False),
    ] = None,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Create a topic (exit 1 if it exists)."""
    if dedup_window_ms == 0:
        raise typer.BadParameter("give a positive number of ms or -1 (forever)", param_hint="--dedup-window-ms")
    retention = {"max_age_ms": max_age_ms, "max_records": max_records, "max_bytes": max_bytes}
    with connect(ctx) as client:
        info = client.create_topic(
            name,
            partitions,
            retention=retention,
            durability=durability.value if durability else None,
            full_policy=full_policy.value if full_policy else None,
            dedup_window_ms=dedup_window_ms,
        )
    if state(ctx).json:
        emit_json(render.topic_json(info))
    else:
        Console().print(
            f"created topic {info.name}: {info.partition_count} partition(s), durability {info.durability}"
        )


@app.command("list")
def list_(ctx: typer.Context, json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """List every topic with its size (--json: an array of topic objects)."""
    with connect(ctx) as client:
        topics = client.list_topics()
    if state(ctx).json:
        emit_json([render.topic_json(t) for t in topics])
    else:
        render.print_topics(Console(), topics)


@app.command("describe")
def describe(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Show a topic's config and each partition's offsets, record and byte counts."""
    with connect(ctx) as client:
        info = client.describe_topic(name)
    if state(ctx).json:
        emit_json(render.topic_json(info))
    else:
        render.print_topic(Console(), info)


@app.command("drop")
def drop(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Drop a topic and all its records (exit 1 if it does not exist)."""
    with connect(ctx) as client:
        client.drop_topic(name)
    if state(ctx).json:
        emit_json({"dropped": name})
    else:
        Console().print(f"dropped topic {name}")
