"""``raftbroker health ADDR``: the probe a container runtime or Kubernetes runs (SPEC §5, §8).

It asks one node's standard gRPC health service (``grpc.health.v1.Health/Check``, the overall
status, service name ``""``). A node answers SERVING only when it is a member of a cluster with a
leader and is caught up to the commit index (``broker.services.health``), so the same check is
the readiness probe. Exit codes: 0 SERVING; 1 NOT_SERVING, unknown or unreachable (one line on
stderr says which); 2 bad usage. It never retries: the caller's probe period does that.
"""

from __future__ import annotations

from typing import Annotated

import grpc
import typer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.config import _check_address

EXIT_NOT_SERVING = 1
EXIT_USAGE = 2


def register(app: typer.Typer) -> None:
    """Add ``health`` to the CLI."""
    app.command("health")(health_command)


def check(address: str, timeout_s: float) -> tuple[bool, str]:
    """(serving, description) of the node at ``address``; never raises for a server-side answer."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            name = code.name if code is not None else "UNKNOWN"
            return False, f"{address}: health check failed: {name}: {exc.details() if isinstance(exc, grpc.Call) else exc}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def health_command(
    address: Annotated[str, typer.Argument(metavar="ADDR", help="gRPC address of the node, host:port")],
    timeout_s: Annotated[float, typer.Option("--timeout", min=0.1, max=60.0,
                                             help="Seconds the check may take")] = 3.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing when SERVING")] = False,
) -> None:
    """Exit 0 when the node at ADDR is SERVING (a member of a cluster with a leader, caught up), else 1."""
    try:
        _check_address(address)
    except ValueError as exc:
        typer.echo(f"raftbroker: error: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    serving, description = check(address, timeout_s)
    if not serving:
        typer.echo(f"raftbroker: not serving: {description}", err=True)
        raise typer.Exit(EXIT_NOT_SERVING)
    if not quiet:
        typer.echo(description)


__all__ = ["check", "health_command", "register"]
