"""``raftbroker topic alter|clear`` and ``raftbroker prune``: retention and explicit deletion (SPEC §2.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from broker.cli import render
from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state
from broker.cli.topic import FullPolicy

if TYPE_CHECKING:  # annotations only: the SDK is imported when a command runs (broker/cli/context.py)
    from broker.client import Retention


def register(topic_app: typer.Typer, app: typer.Typer) -> None:
    """Add ``topic alter``, ``topic clear`` and ``prune`` to the CLI."""
    topic_app.command("alter")(alter)
    topic_app.command("clear")(clear)
    app.command("prune")(prune)


def merged_retention(current: Retention, max_age_ms: int | None, max_records: int | None,
                     max_bytes: int | None) -> Retention:
    """``current`` with the given caps replaced; 0 removes a cap, None keeps it."""
    from broker.client import Retention

    def pick(new: int | None, old: int | None) -> int | None:
        if new is None:
            return old
        return new or None

    return Retention(max_age_ms=pick(max_age_ms, current.max_age_ms),
                     max_records=pick(max_records, current.max_records),
                     max_bytes=pick(max_bytes, current.max_bytes))


def alter(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    max_age_ms: Annotated[int | None, typer.Option(min=0, help="Delete records older than this; 0: no cap.",
                                                   show_default=False)] = None,
    max_records: Annotated[int | None, typer.Option(min=0, help="Records kept per partition; 0: no cap.",
                                                    show_default=False)] = None,
    max_bytes: Annotated[int | None, typer.Option(min=0, help="Bytes kept per partition; 0: no cap.",
                                                  show_default=False)] = None,
    full_policy: Annotated[
        FullPolicy | None, typer.Option(help="When a cap is hit: drop the oldest records, or refuse the publish.",
                                        show_default=False)
    ] = None,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Change a topic's retention caps or full policy; caps not given keep their value.

    Lowered caps apply at once: with discard_old the oldest records are deleted (by the next
    append or housekeeping pass). --json prints the topic as 'topic describe --json' does.
    """
    if max_age_ms is None and max_records is None and max_bytes is None and full_policy is None:
        raise typer.BadParameter("give at least one of --max-age-ms, --max-records, --max-bytes, --full-policy")
    with connect(ctx) as client:
        current = client.describe_topic(name)
        retention = merged_retention(current.retention, max_age_ms, max_records, max_bytes)
        info = client.alter_topic(name, retention=retention, full_policy=full_policy.value if full_policy else None)
    if state(ctx).json:
        emit_json(render.topic_json(info))
    else:
        Console().print(f"altered topic {info.name}:")
        render.print_topic(Console(), info)


def clear(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Topic name.")],
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Delete every record of a topic; offsets keep growing (readers behind get skip_forward).

    --json: {"cleared": NAME}.
    """
    with connect(ctx) as client:
        client.clear_topic(name)
    if state(ctx).json:
        emit_json({"cleared": name})
    else:
        Console().print(f"cleared topic {name} (offsets keep growing from where they were)")


def prune(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    before: Annotated[int | None, typer.Option("--before", min=0, help="Delete every record below this offset "
                                               "(at most a partition's end: past it, nothing is deleted).",
                                               show_default=False)] = None,
    partition: Annotated[int | None, typer.Option("--partition", "-p", min=0,
                                                  help="Only this partition (default: every partition).")] = None,
    group: Annotated[str | None, typer.Option("--group", help="Prune up to what this consumer group (marked lead: "
                                              "'group mark TOPIC G --lead') has committed; with --before: no "
                                              "further than OFFSET. Refused whole (nothing deleted) if that "
                                              "passes what a group marked protect has not committed.",
                                              show_default=False)] = None,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Delete the records of TOPIC before a position; prints how many were deleted.

    A group marked protect refuses a prune past its committed position (nothing is deleted).
    --json: {"topic": T, "pruned": N}. Readers behind the new start get skip_forward.
    """
    if before is None and group is None:
        raise typer.BadParameter("give --before OFFSET (or --group G)", param_hint="--before")
    if before == 0 and group is not None:
        raise typer.BadParameter("0 with --group would delete nothing; leave --before out to prune up to what "
                                 "the group committed", param_hint="--before")
    with connect(ctx) as client:
        pruned = client.prune(topic, before, partition, group=group)
    if state(ctx).json:
        emit_json({"topic": topic, "pruned": pruned})
    else:
        Console().print(f"pruned {pruned} record(s) from {topic}")
