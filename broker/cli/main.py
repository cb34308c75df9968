"""``raftbroker``: the command line of the broker (``python -m broker.cli.main`` works too).

Global options come before the command: ``raftbroker --bootstrap h:p,h:p --json topic list``;
``--json`` and ``--bootstrap`` may also follow it: ``raftbroker topic list --json``.
Human-readable tables by default; ``--json`` prints JSON for scripts (one document per command,
or one object per line for streams: ``publish`` results and ``consume`` records/events).

Commands of other installed packages join through the ``raftbroker.commands`` entry-point group
(:func:`register_plugins`): e.g. ``drill`` from the repository's ``chaos`` package.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points, version
from typing import Annotated

import typer

from broker.cli import bench, cluster, data, dedup, log_admin, route, spark_jobs, topic
from broker.cli.context import DEFAULT_BOOTSTRAP, CliState, bootstrap_from_config, parse_bootstrap
from broker.cli.failover_bench import failover_command
from broker.cli.group import register as register_group
from broker.cli.health import register as register_health
from broker.cli.serve import register as register_serve

# A copy of broker.client.routing.TIMEOUT_S_MAX (the CLI imports no SDK until a command runs;
# tests/cli/test_cli_unit.py pins the two equal).
TIMEOUT_S_MAX = 86_400.0

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
        float, typer.Option("--timeout", min=0.1, max=TIMEOUT_S_MAX, help="Seconds one attempt of a request may take.")
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
    client_config: Annotated[
        str | None,
        typer.Option("--client-config", envvar="RAFTBROKER_CLIENT_CONFIG", show_default=False,
                     help="Client config file (TOML: CA, client certificate, token, bootstrap), as "
                     "'raftbroker dev --secure' prints it."),
    ] = None,
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Global options shared by every client command."""
    ctx.obj = CliState(
        bootstrap=bootstrap_from_config(ctx, client_config) or parse_bootstrap(bootstrap),
        client_config=client_config,
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

PLUGIN_GROUP = "raftbroker.commands"


def register_plugins(target: typer.Typer, plugins: list[EntryPoint] | None = None) -> None:
    """Add the commands of the ``raftbroker.commands`` entry points (``plugins``: the installed ones).

    Each entry point names a ``register(app)`` function that adds its commands to ``target``; it
    may read the global options from the root context's ``obj`` (a :class:`CliState`). An entry
    point whose package is not installed (``drill`` in a wheel: ``chaos`` is not in it) becomes a
    command of that name that says so on stderr and exits 2, instead of a traceback.
    """
    for plugin in entry_points(group=PLUGIN_GROUP) if plugins is None else plugins:
        try:
            hook = plugin.load()
        except ImportError as err:
            target.command(plugin.name, help=f"(not available: {plugin.module} is not installed)",
                           context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                           add_help_option=False)(_missing(plugin, err))
            continue
        hook(target)


def _missing(plugin: EntryPoint, err: ImportError) -> Callable[[], None]:
    def command() -> None:
        typer.echo(f"error: `raftbroker {plugin.name}` comes from the `{plugin.module.split('.')[0]}` package, which "
                   f"is not installed here ({err}); it runs from a checkout of the repository (installed there "
                   "with `pip install -e .`), not from the wheel", err=True)
        raise typer.Exit(2)
    return command


register_health(app)
spark_jobs.register(app)
register_plugins(app)


if __name__ == "__main__":
    app(prog_name="raftbroker")
