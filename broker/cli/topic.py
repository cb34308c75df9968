"""``raftbroker topic create|list|describe|drop`` (``alter`` and ``clear``: :mod:`broker.cli.log_admin`)."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from broker.cli import render
from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state

app = typer.Typer(help="Create, list, describe, alter, clear and drop topics.", no_args_is_help=True)


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
    schema: Annotated[
        Path | None,
        typer.Option("--schema", help="JSON Schema file: every value must be a JSON document that satisfies it.",
                     show_default=False, exists=True, dir_okay=False, readable=True),
    ] = None,
    dedup_fields: Annotated[
        str | None,
        typer.Option("--dedup-fields", help="Comma-separated JSON fields (dotted paths allowed) whose values form "
                     "a permanent unique key: a repeat is refused (ALREADY_EXISTS).", show_default=False),
    ] = None,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Create a topic (exit 1 if it exists)."""
    if dedup_window_ms == 0:
        raise typer.BadParameter("give a positive number of ms or -1 (forever)", param_hint="--dedup-window-ms")
    schema_json = _read_schema(schema) if schema is not None else None
    fields = [f.strip() for f in dedup_fields.split(",") if f.strip()] if dedup_fields is not None else None
    if fields is not None and not fields:
        raise typer.BadParameter("give at least one field name", param_hint="--dedup-fields")
    retention = {"max_age_ms": max_age_ms, "max_records": max_records, "max_bytes": max_bytes}
    with connect(ctx) as client:
        info = client.create_topic(
            name,
            partitions,
            retention=retention,
            durability=durability.value if durability else None,
            full_policy=full_policy.value if full_policy else None,
            dedup_window_ms=dedup_window_ms,
            schema=schema_json,
            dedup_fields=fields,
        )
    if state(ctx).json:
        emit_json(render.topic_json(info))
    else:
        Console().print(
            f"created topic {info.name}: {info.partition_count} partition(s), durability {info.durability}"
        )


def _read_schema(path: Path) -> str:
    """The schema file's text, checked to be a JSON object (usage error otherwise)."""
    text = path.read_text()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise typer.BadParameter(f"{path} is not JSON: {err}", param_hint="--schema") from None
    if not isinstance(document, dict):
        raise typer.BadParameter(f"{path} must hold a JSON object (a JSON Schema)", param_hint="--schema")
    return text


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
