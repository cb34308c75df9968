"""``raftbroker dedup watermarks|reset``: producer-session watermarks (SPEC §4)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state

app = typer.Typer(help="Inspect and reset producer-session dedup watermarks.", no_args_is_help=True)


@app.command("watermarks")
def watermarks(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Each producer session's high watermark on TOPIC: the highest |msg_id| stored per dedup id.

    --json: [{"dedup_id": D, "msg_id": N}, ...] (an empty list when there are none).
    """
    with connect(ctx) as client:
        marks = client.get_watermarks(topic)
    if state(ctx).json:
        emit_json([{"dedup_id": m.dedup_id, "msg_id": m.msg_id} for m in marks])
        return
    if not marks:
        Console().print(f"no watermarks on {topic}")
        return
    table = Table("dedup id", "msg id", box=None)
    for m in marks:
        table.add_row(m.dedup_id, str(m.msg_id))
    Console().print(table)


@app.command("reset")
def reset(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    dedup_id: Annotated[str, typer.Argument(help="Producer session whose watermark is forgotten.")],
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Forget DEDUP_ID's watermark on TOPIC: its next message may start again at id 1.

    An unknown DEDUP_ID changes nothing and is said so (exit 0).
    --json: {"topic": T, "dedup_id": D, "reset": true|false} (false: there was no watermark).
    """
    with connect(ctx) as client:
        existed = client.reset_watermark(topic, dedup_id)
    if state(ctx).json:
        emit_json({"topic": topic, "dedup_id": dedup_id, "reset": existed})
    elif existed:
        Console().print(f"reset the watermark of {dedup_id} on {topic}")
    else:
        Console().print(f"{topic} has no watermark of {dedup_id}: nothing to reset")
