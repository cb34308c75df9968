"""``raftbroker group ...`` (SPEC §3.2, §6); ``raftbroker consume --group`` is in ``group_consume``.

Commands (``consume --group`` is :mod:`broker.cli.group_consume`): ``create``,
``list``, ``describe``, ``lag``, ``seek``, ``replay``, ``pause``, ``resume``,
``mark``, ``delete`` and ``dlq list|retry|retry-all|purge``. Human tables by default, ``--json`` for scripts:
- lag: ``{"topic", "group", "paused", "lag", "lag_seconds", "partitions": [{"partition",
  "start_offset", "end_offset", "committed", "lag", "in_flight", "retrying", "dead", "lag_ms"}]}``;
- group: ``{"topic", "group", "mode", "paused", "dlq_topic", ... config ..., "members": {id: [p]},
  "prune_role"}``;
- dead letter: ``{"partition", "offset", "attempts", "reason", "dead_ms", "dlq_partition",
  "dlq_offset", "record": <record> | null}``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from broker.cli import render
from broker.cli.context import BootstrapOption, JsonFlag, connect, emit_json, state
from broker.cli.data import FROM_HELP, parse_from

if TYPE_CHECKING:  # annotations only: the SDK is imported when a command runs (broker/cli/context.py)
    from broker.client import DeadLettersRetried, GroupLag

app = typer.Typer(help="Consumer groups: lag, seek and replay, pause and resume, dead letters.",
                  no_args_is_help=True)
dlq_app = typer.Typer(help="Dead letters of a group: list, retry, retry-all, purge.", no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")
GROUP_FROM_HELP = "Where a new group starts: " + FROM_HELP.removeprefix("Where to start: ")

Topic = Annotated[str, typer.Argument(help="Topic name.")]
Group = Annotated[str, typer.Argument(help="Group name.")]


def register(root: typer.Typer) -> None:
    """Add ``group`` to the CLI."""
    root.add_typer(app, name="group")


def _say(ctx: typer.Context, obj: Any, text: str) -> None:
    if state(ctx).json:
        emit_json(obj)
    else:
        Console().print(text)


# -- groups ---------------------------------------------------------------------------------------
@app.command("create")
def create(
    ctx: typer.Context, topic: Topic, group: Group,
    mode: Annotated[str, typer.Option(help="queue (leases to any member) or stream (partitions per member).")]
    = "queue",
    from_: Annotated[str, typer.Option("--from", help=GROUP_FROM_HELP)] = "earliest",
    visibility_timeout_ms: Annotated[int | None, typer.Option(min=10, help="Lease length.")] = None,
    backoff: Annotated[str | None, typer.Option(help="fixed or exponential.")] = None,
    base_delay_ms: Annotated[int | None, typer.Option(min=1, help="First retry delay.")] = None,
    max_delay_ms: Annotated[int | None, typer.Option(min=1, help="Longest retry delay.")] = None,
    max_attempts: Annotated[int | None, typer.Option(min=1, help="Failed deliveries before dead-lettering.")]
    = None,
    ordered: Annotated[bool, typer.Option(help="Queue mode: one lease in flight per key.")] = False,
    session_timeout_ms: Annotated[int | None, typer.Option(min=10, help="Stream mode: member session.")] = None,
    json_: JsonFlag = False, bootstrap_: BootstrapOption = None,
) -> None:
    """Create GROUP on TOPIC (groups are also created by their first consumer)."""
    if mode == "queue" and session_timeout_ms is not None:
        raise typer.BadParameter("applies to --mode stream (queue-mode members have no sessions)",
                                 param_hint="--session-timeout-ms")
    if mode == "stream" and ordered:
        raise typer.BadParameter("applies to --mode queue (stream mode is ordered per partition already)",
                                 param_hint="--ordered")
    start, timestamp_ms = parse_from(from_)
    with connect(ctx) as client:
        info = client.groups.create(topic, group, mode, start=start, timestamp_ms=timestamp_ms,
                                    visibility_timeout_ms=visibility_timeout_ms, backoff=backoff,
                                    base_delay_ms=base_delay_ms, max_delay_ms=max_delay_ms,
                                    max_attempts=max_attempts, ordered=ordered,
                                    session_timeout_ms=session_timeout_ms)
    _say(ctx, dataclasses.asdict(info), f"created group {group} on {topic} ({info.mode}), dead letters in "
                                        f"{info.dlq_topic}")


@app.command("list")
def list_groups(ctx: typer.Context, topic: Topic, json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Every group of TOPIC."""
    with connect(ctx) as client:
        groups = client.groups.list(topic)
    if state(ctx).json:
        emit_json([dataclasses.asdict(g) for g in groups])
        return
    table = Table("group", "mode", "paused", "prune role", "dead letters topic", box=None)
    for g in groups:
        table.add_row(g.group, g.mode, "yes" if g.paused else "no", g.prune_role, g.dlq_topic)
    Console().print(table if groups else f"no groups on {topic}")


@app.command("describe")
def describe(ctx: typer.Context, topic: Topic, group: Group, json_: JsonFlag = False,
             bootstrap_: BootstrapOption = None) -> None:
    """GROUP's configuration and (stream mode) its members and their partitions."""
    with connect(ctx) as client:
        info = client.groups.describe(topic, group)
    members = ", ".join(f"{m}: {list(ps)}" for m, ps in info.members.items()) or "none"
    _say(ctx, dataclasses.asdict(info),
         f"{info.group} on {info.topic}: {info.mode}{' (paused)' if info.paused else ''}, visibility "
         f"{info.visibility_timeout_ms} ms, {info.backoff} backoff {info.base_delay_ms}..{info.max_delay_ms} ms, "
         f"max attempts {info.max_attempts}{', ordered' if info.ordered else ''}; dead letters in {info.dlq_topic}; "
         f"prune role {info.prune_role}; members {members}")


def lag_json(topic: str, group: str, lag: GroupLag) -> dict[str, Any]:
    return {"topic": topic, "group": group, "paused": lag.paused, "lag": lag.lag, "lag_seconds": lag.lag_seconds,
            "partitions": [dataclasses.asdict(p) for p in lag.partitions]}


@app.command("lag")
def lag(ctx: typer.Context, topic: Topic, group: Group, json_: JsonFlag = False,
        bootstrap_: BootstrapOption = None) -> None:
    """Per partition: end offset, committed, lag, in flight, retrying, dead, and lag in seconds."""
    with connect(ctx) as client:
        figures = client.groups.lag(topic, group)
    if state(ctx).json:
        emit_json(lag_json(topic, group, figures))
        return
    table = Table("partition", "end", "committed", "lag", "in flight", "retrying", "dead", "lag (s)", box=None)
    for p in figures.partitions:
        table.add_row(*(str(v) for v in (p.partition, p.end_offset, p.committed, p.lag, p.in_flight, p.retrying,
                                         p.dead)), f"{p.lag_ms / 1000:.1f}")
    Console().print(table)
    Console().print(f"total lag {figures.lag}{' (paused)' if figures.paused else ''}")


@app.command("seek")
def seek(
    ctx: typer.Context, topic: Topic, group: Group,
    to: Annotated[str, typer.Option("--to", help="earliest, latest, offset:N, ts:MS|ISO or token:POSITION.")],
    partition: Annotated[int | None, typer.Option("--partition", "-p", min=0, help="Only this partition.")] = None,
    json_: JsonFlag = False, bootstrap_: BootstrapOption = None,
) -> None:
    """Move GROUP's committed position (backwards too); prints the new position per partition."""
    start, timestamp_ms = parse_from(to, "--to")
    with connect(ctx) as client:
        moved = client.groups.seek(topic, group, start, timestamp_ms=timestamp_ms, partition=partition)
    _say(ctx, {str(p): o for p, o in moved.items()}, " ".join(f"{p}:{o}" for p, o in sorted(moved.items())))


@app.command("replay")
def replay(
    ctx: typer.Context, topic: Topic, group: Group,
    from_: Annotated[str, typer.Option("--from", help="A timestamp: ts:MS, ts:ISO-8601 or a number of ms.")],
    json_: JsonFlag = False, bootstrap_: BootstrapOption = None,
) -> None:
    """Deliver everything again from a point in time (a seek to that timestamp)."""
    bare = from_.strip()
    refusal = typer.BadParameter(f"replay takes a timestamp (ts:MS, ts:ISO-8601 with a zone, or a number of ms); "
                                 f"got {from_!r}", param_hint="--from")
    # a bare number is ms here, as the help says (for --from of consume one below 10**12 is an offset)
    try:
        timestamp_ms = int(bare) if bare.isascii() and bare.isdigit() else parse_from(from_)[1]
    except typer.BadParameter:  # its message lists the positions consume takes, which replay does not
        raise refusal from None
    if timestamp_ms is None:
        raise refusal
    with connect(ctx) as client:
        moved = client.groups.replay(topic, group, timestamp_ms)
    _say(ctx, {str(p): o for p, o in moved.items()}, " ".join(f"{p}:{o}" for p, o in sorted(moved.items())))


def _pause(ctx: typer.Context, topic: str, group: str | None, paused: bool) -> None:
    with connect(ctx) as client:
        changed = client.groups.pause(topic, group) if paused else client.groups.resume(topic, group)
    verb = "paused" if paused else "resumed"
    _say(ctx, {"topic": topic, verb: changed}, f"{verb}: {', '.join(changed) or 'nothing to change'}")


@app.command("pause")
def pause(ctx: typer.Context, topic: Topic,
          group: Annotated[str | None, typer.Argument(help="Group (default: every group of the topic).")] = None,
          json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Stop deliveries to GROUP (or to every group of TOPIC); replicated."""
    _pause(ctx, topic, group, True)


@app.command("resume")
def resume(ctx: typer.Context, topic: Topic,
           group: Annotated[str | None, typer.Argument(help="Group (default: every group of the topic).")] = None,
           json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Resume deliveries to GROUP (or to every group of TOPIC)."""
    _pause(ctx, topic, group, False)


@app.command("mark")
def mark(ctx: typer.Context, topic: Topic, group: Group,
         lead: Annotated[bool, typer.Option("--lead", help="GROUP may prune TOPIC up to its committed positions "
                                            "(raftbroker prune TOPIC --group GROUP).")] = False,
         protect: Annotated[bool, typer.Option("--protect", help="No prune or clear of TOPIC may delete records "
                                               "GROUP has not committed.")] = False,
         none: Annotated[bool, typer.Option("--none", help="Neither (the default of a new group).")] = False,
         json_: JsonFlag = False, bootstrap_: BootstrapOption = None) -> None:
    """Set GROUP's prune role: --lead, --protect or --none (replicated). --json prints the group."""
    chosen = [name for name, flag in (("lead", lead), ("protect", protect), ("none", none)) if flag]
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --lead, --protect, --none")
    with connect(ctx) as client:
        info = client.groups.mark(topic, group, chosen[0])
    _say(ctx, dataclasses.asdict(info), f"group {group} of {topic} is now prune role {info.prune_role}")


@app.command("delete")
def delete(ctx: typer.Context, topic: Topic, group: Group, json_: JsonFlag = False,
           bootstrap_: BootstrapOption = None) -> None:
    """Delete GROUP's positions, retries and dead-letter index (its dead-letter topic stays)."""
    with connect(ctx) as client:
        client.groups.delete(topic, group)
    _say(ctx, {"topic": topic, "group": group, "deleted": True}, f"deleted group {group} of {topic}")


# -- dead letters ---------------------------------------------------------------------------------
@dlq_app.command("list")
def dlq_list(
    ctx: typer.Context, topic: Topic, group: Group,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=10_000, help="At most N.")] = 100,
    partition: Annotated[int | None, typer.Option("--partition", "-p", min=0, help="Only this partition.")] = None,
    json_: JsonFlag = False, bootstrap_: BootstrapOption = None,
) -> None:
    """GROUP's dead letters in (partition, offset) order."""
    with connect(ctx) as client:
        dead = client.groups.dead_letters(topic, group, limit=limit, partition=partition)
    if state(ctx).json:
        emit_json([{**{k: v for k, v in dataclasses.asdict(d).items() if k != "record"},
                    "record": render.record_json(d.record) if d.record is not None else None} for d in dead])
        return
    table = Table("partition", "offset", "attempts", "reason", "value", box=None)
    for d in dead:
        value = d.record.value.decode("utf-8", errors="backslashreplace")[:60] if d.record else "(not retained)"
        table.add_row(str(d.partition), str(d.offset), str(d.attempts), d.reason, value)
    Console().print(table if dead else f"no dead letters in {group}")


def _position(text: str) -> tuple[int, int]:
    partition, sep, offset = text.partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit():
        raise typer.BadParameter(f"{text!r} is not PARTITION:OFFSET", param_hint="MESSAGES")
    return int(partition), int(offset)


@dlq_app.command("retry")
def dlq_retry(
    ctx: typer.Context, topic: Topic, group: Group,
    messages: Annotated[list[str], typer.Argument(help="Dead letters as PARTITION:OFFSET.")],
    json_: JsonFlag = False, bootstrap_: BootstrapOption = None,
) -> None:
    """Deliver these dead letters again (their attempts start over)."""
    positions = [_position(m) for m in messages]
    with connect(ctx) as client:
        _say_retried(ctx, client.groups.retry_dead_letters(topic, group, positions))


@dlq_app.command("retry-all")
def dlq_retry_all(ctx: typer.Context, topic: Topic, group: Group, json_: JsonFlag = False,
                  bootstrap_: BootstrapOption = None) -> None:
    """Deliver every dead letter of GROUP again."""
    with connect(ctx) as client:
        _say_retried(ctx, client.groups.retry_all_dead_letters(topic, group))


def _say_retried(ctx: typer.Context, done: DeadLettersRetried) -> None:
    pruned = (f"; {done.pruned} left dead: their records were pruned (`group dlq purge` forgets them)"
              if done.pruned else "")
    _say(ctx, {"retried": done.retried, "pruned": done.pruned}, f"retried {done.retried} dead letter(s){pruned}")


@dlq_app.command("purge")
def dlq_purge(ctx: typer.Context, topic: Topic, group: Group, json_: JsonFlag = False,
              bootstrap_: BootstrapOption = None) -> None:
    """Forget GROUP's dead letters (their copies stay in the dead-letter topic)."""
    with connect(ctx) as client:
        count = client.groups.purge_dead_letters(topic, group)
    _say(ctx, {"purged": count}, f"purged {count} dead letter(s)")
