"""``raftbroker``: the command line of the broker (``python -m broker.cli.main`` works too).

Global options come before the command: ``raftbroker --bootstrap h:p,h:p --json topic list``;
``--json`` and ``--bootstrap`` may also follow it: ``raftbroker topic list --json``.
Human-readable tables by default; ``--json`` prints JSON for scripts (one document per command,
or one object per line for streams: ``publish`` results and ``consume`` records/events).
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Annotated

import typer

from broker.cli import bench, cluster, data, dedup, drill, log_admin, route, spark_jobs, topic
from broker.cli.context import DEFAULT_BOOTSTRAP, CliState, parse_bootstrap
from broker.cli.failover_bench import failover_command
from broker.cli.group import register as register_group
from broker.cli.serve import register as register_serve

app = typer.Typer(
    name="raftbroker",
    help="A durable, Raft-replicated message broker: run nodes, manage topics, publish and consume.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    """``--version``: print ``raftbroker <version>`` (the installed distribution's) and exit 0."""
    if value:
        typer.echo(f"raftbroker {version('raftbroker')}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    bootstrap: Annotated[
        str,
        typer.Option(
            "--bootstrap",
            "-b",
            envvar="RAFTBROKER_BOOTSTRAP",
            help="Comma-separated gRPC addresses of any cluster nodes (the leader is found from them).",
        ),
    ] = DEFAULT_BOOTSTRAP,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds one attempt of a request may take.")
    ] = 10.0,
    retry_deadline_s: Annotated[
        float,
        typer.Option(
            "--retry-deadline",
            min=0.0,
            envvar="RAFTBROKER_RETRY_DEADLINE",
            help="Seconds to keep retrying while no leader is reachable (a failover). A cluster that lost "
            "its majority fails sooner: once every reachable node says 'no quorum' for about a second.",
        ),
    ] = 10.0,
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Global options shared by every client command."""
    ctx.obj = CliState(
        bootstrap=parse_bootstrap(bootstrap),
        json=json_output,
        timeout_s=timeout_s,
        retry_deadline_s=retry_deadline_s,
    )


app.add_typer(topic.app, name="topic")
app.add_typer(cluster.app, name="cluster")
bench.app.command("failover")(failover_command)
app.add_typer(bench.app, name="bench")
app.add_typer(dedup.app, name="dedup")
app.add_typer(route.app, name="route")
log_admin.register(topic.app, app)
data.register(app)
register_group(app)
register_serve(app)
drill.register(app)
spark_jobs.register(app)


if __name__ == "__main__":
    app(prog_name="raftbroker")
