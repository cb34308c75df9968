"""What every client-facing command shares: the global options, the client, error reporting.

Contract: a command never shows a traceback. A server or connection error prints one line
``raftbroker: error: ...`` to stderr and exits 1; bad usage exits 2 (typer's usage message).

``--json`` and ``--bootstrap`` are global options (before the command) and are accepted after
every client command too (:data:`JsonFlag`, :data:`BootstrapOption`): ``raftbroker topic list
--json`` is ``raftbroker --json topic list``; a ``--bootstrap`` after the command wins.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:  # the SDK (grpc, protobuf: ~0.3 s) is imported when a command needs it, so that
    # `--help`, `--version`, usage errors and `serve` do not wait for it
    from broker.client import Client

EXIT_SERVER_ERROR = 1
EXIT_USAGE = 2
DEFAULT_BOOTSTRAP = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"


@dataclass(frozen=True)
class CliState:
    """The global options, stored in ``ctx.obj`` by the app callback."""

    bootstrap: tuple[str, ...]
    json: bool = False
    timeout_s: float = 10.0
    retry_deadline_s: float = 10.0
    client_config: str | None = None  # --client-config / RAFTBROKER_CLIENT_CONFIG: TLS and token


def state(ctx: typer.Context) -> CliState:
    """The global options (defaults when a command is invoked without the app callback)."""
    root = ctx.find_root()
    obj = root.obj if isinstance(root.obj, CliState) else None
    return obj or CliState(bootstrap=tuple(DEFAULT_BOOTSTRAP.split(",")))


def parse_bootstrap(text: str, option: str = "--bootstrap") -> tuple[str, ...]:
    """``host:port,host:port`` as a tuple; raises ``typer.BadParameter`` naming ``option`` when
    empty or malformed."""
    addresses = tuple(a.strip() for a in text.split(",") if a.strip())
    if not addresses:
        raise typer.BadParameter("give at least one host:port", param_hint=option)
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise typer.BadParameter(f"{address!r} is not host:port", param_hint=option)
    return addresses


def bootstrap_from_config(ctx: typer.Context, client_config: str | None) -> tuple[str, ...] | None:
    """The client config's addresses when ``--bootstrap`` was left at its default (a usage error,
    exit 2, for a broken config file)."""
    source = ctx.get_parameter_source("bootstrap")  # typer's click: compared by name, not imported
    if client_config is None or source is None or source.name != "DEFAULT":
        return None
    from broker.client import ClientConfigError, load_client_config

    try:
        loaded = load_client_config(client_config)
    except ClientConfigError as err:
        fail(str(err), EXIT_USAGE)
    return loaded.bootstrap if loaded is not None and loaded.bootstrap else None


def _override(ctx: typer.Context, **changes: Any) -> None:
    """Change the global options for the rest of this invocation (from a command's own flag)."""
    root = ctx.find_root()
    root.obj = replace(state(ctx), **changes)


def _json_after_command(ctx: typer.Context, value: bool) -> bool:
    if value and not ctx.resilient_parsing:
        _override(ctx, json=True)
    return value


def _bootstrap_after_command(ctx: typer.Context, value: str | None) -> str | None:
    if value is not None and not ctx.resilient_parsing:
        _override(ctx, bootstrap=parse_bootstrap(value))
    return value


# The global --json and --bootstrap, repeated on each client command so they may follow it. The
# parameters exist for parsing only: their callbacks update the global options, which commands
# read through :func:`state` (so a command body ignores the values it receives).
JsonFlag = Annotated[
    bool,
    typer.Option("--json", help="Print JSON instead of tables (also accepted before the command).",
                 callback=_json_after_command),
]
BootstrapOption = Annotated[
    str | None,
    typer.Option("--bootstrap", "-b", help="Comma-separated node addresses (overrides the global --bootstrap).",
                 callback=_bootstrap_after_command, show_default=False),
]


def fail(message: str, code: int = EXIT_SERVER_ERROR) -> NoReturn:
    """Print one error line to stderr and exit with ``code``."""
    sys.stderr.write(f"raftbroker: error: {message}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn SDK errors into one stderr line and exit 1; Ctrl-C exits 130; a closed pipe exits 0."""
    from broker.client import BrokerError, ClientConfigError

    try:
        yield
    except (typer.Exit, typer.Abort, typer.TyperException):  # usage errors and exits keep their codes
        raise
    except BrokerError as err:
        fail(str(err))
    except ClientConfigError as err:
        fail(str(err), EXIT_USAGE)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BrokenPipeError:
        _silence_stdout()
        raise typer.Exit(0) from None
    except Exception as err:  # a bug: still one line, unless RAFTBROKER_DEBUG=1 asks for the trace
        if os.environ.get("RAFTBROKER_DEBUG"):
            raise
        fail(f"internal error: {type(err).__name__}: {err} (set RAFTBROKER_DEBUG=1 for a traceback)")


@contextmanager
def connect(ctx: typer.Context) -> Iterator[Client]:
    """A client for the command's cluster, inside :func:`reported_errors`."""
    from broker.client import Client

    opts = state(ctx)
    with reported_errors(), Client(
        opts.bootstrap, timeout_s=opts.timeout_s, retry_deadline_s=opts.retry_deadline_s,
        client_config=opts.client_config,
    ) as client:
        yield client


def _silence_stdout() -> None:
    """After a closed pipe (``| head``), stop Python from complaining again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def emit_json(obj: Any) -> None:
    """One compact JSON document on its own line of stdout."""
    sys.stdout.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n")
