"""``raftbroker health ADDR`` / ``raftbroker-health ADDR``: the probe a container engine or Kubernetes
runs (SPEC §5, §8).

It asks one node's standard gRPC health service (``grpc.health.v1.Health/Check``, the overall
status, service name ``""``). A node answers SERVING only when it is a member of a cluster with a
leader and is caught up to the commit index (``broker.services.health``), so the same check is
the readiness probe. Exit codes: 0 SERVING; 1 NOT_SERVING, unknown or unreachable (one line on
stderr says which); 2 bad usage. It never retries: the caller's probe period does that.

``raftbroker-health`` (:func:`main`) is the lean form for probes: it imports grpc and nothing of the
CLI (the full ``raftbroker`` CLI takes seconds to import on a busy machine, longer than a probe's
timeout); ``raftbroker health`` is the same check inside the CLI.
"""

import sys
from typing import TYPE_CHECKING, Annotated

if TYPE_CHECKING:
    import grpc
    import typer

EXIT_SERVING = 0
EXIT_NOT_SERVING = 1
EXIT_USAGE = 2
TIMEOUT_S_DEFAULT = 3.0
TIMEOUT_S_MAX = 60.0
CLIENT_CONFIG_ENV = "RAFTBROKER_CLIENT_CONFIG"  # the same variable as broker.client.CLIENT_CONFIG_ENV


def valid_address(address: str) -> bool:
    """``host:port`` with a port in 1..65535 (the form every node address takes)."""
    host, sep, port = address.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


def _channel(address: str, client_config: str | None) -> "grpc.Channel":
    """A plaintext channel, or a TLS one from ``client_config`` (raises ClientConfigError)."""
    import grpc

    if client_config is None:
        return grpc.insecure_channel(address)
    from broker.client.security import load_client_config  # only then: the plaintext probe stays lean

    loaded = load_client_config(client_config)
    assert loaded is not None  # a path was given
    security = loaded.security
    return grpc.secure_channel(address, security.channel_credentials(), options=security.channel_options())


def _wants_tls(address: str, exc: "grpc.Call") -> bool:
    """Whether a failed plaintext check met a node that speaks TLS (it closes a plaintext
    connection, which gRPC reports as UNAVAILABLE "Socket closed", as it would a node going down)."""
    import grpc

    if exc.code() != grpc.StatusCode.UNAVAILABLE or "socket closed" not in (exc.details() or "").lower():
        return False
    from broker.client.security import answers_tls  # only on this failure: the probe's success path stays lean

    return answers_tls(address)


def check(address: str, timeout_s: float, client_config: str | None = None) -> tuple[bool, str]:
    """(serving, description) of the node at ``address``; never raises for a server-side answer.
    ``client_config``: a client config file for a TLS node (raises ClientConfigError if unreadable)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with _channel(address, client_config) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.RpcError as exc:
            if isinstance(exc, grpc.Call):
                if client_config is None and _wants_tls(address, exc):
                    return False, (f"{address}: health check failed: the node expects TLS, and this probe connects "
                                   f"without it: give it the cluster's client config (--client-config PATH or "
                                   f"${CLIENT_CONFIG_ENV})")
                if client_config is not None and "wrong_version_number" in (exc.details() or "").lower():
                    return False, (f"{address}: health check failed: this probe connects with TLS (its client "
                                   f"config), and the node answers without it: leave the client config out")
                return False, f"{address}: health check failed: {exc.code().name}: {exc.details()}"
            return False, f"{address}: health check failed: {exc}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address}: {status}"


def run(address: str, timeout_s: float, quiet: bool, client_config: str | None = None) -> int:
    """Check, print, and return the exit code (see the module docstring)."""
    if not valid_address(address):
        print(f"raftbroker: error: {address!r} is not host:port", file=sys.stderr)
        return EXIT_USAGE
    if not 0 < timeout_s <= TIMEOUT_S_MAX:
        print(f"raftbroker: error: --timeout must be in (0, {TIMEOUT_S_MAX:g}] seconds", file=sys.stderr)
        return EXIT_USAGE
    try:
        serving, description = check(address, timeout_s, client_config)
    except ValueError as exc:  # ClientConfigError: names the file and the setting
        print(f"raftbroker: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not serving:
        print(f"raftbroker: not serving: {description}", file=sys.stderr)
        return EXIT_NOT_SERVING
    if not quiet:
        print(description)
    return EXIT_SERVING


def main(argv: list[str] | None = None) -> int:
    """``raftbroker-health [--quiet] [--timeout S] [--client-config PATH] ADDR`` (argparse: no CLI
    framework to import)."""
    import argparse
    import os

    from broker.cli.launch import grpc_verbosity

    grpc_verbosity(["raftbroker-health"], os.environ)  # C core's own lines would come before ours: none
    parser = argparse.ArgumentParser(prog="raftbroker-health", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("address", metavar="ADDR", help="gRPC address of the node, host:port")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S_DEFAULT, help="seconds the check may take")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing when SERVING")
    parser.add_argument("--client-config", default=os.environ.get(CLIENT_CONFIG_ENV) or None, metavar="PATH",
                        help=f"client config file (CA, token) for a TLS node; default ${CLIENT_CONFIG_ENV}")
    args = parser.parse_args(argv)
    return run(args.address, args.timeout, args.quiet, args.client_config)


def register(app: "typer.Typer") -> None:
    """Add ``health`` to the CLI."""
    import typer

    def health_command(
        address: Annotated[str, typer.Argument(metavar="ADDR", help="gRPC address of the node, host:port")],
        timeout_s: Annotated[float, typer.Option("--timeout", min=0.1, max=TIMEOUT_S_MAX,
                                                 help="Seconds the check may take")] = TIMEOUT_S_DEFAULT,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print nothing when SERVING")] = False,
        client_config: Annotated[str | None, typer.Option(
            "--client-config", envvar=CLIENT_CONFIG_ENV, show_default=False,
            help="Client config file (CA, token) for a TLS node")] = None,
    ) -> None:
        """Exit 0 when the node at ADDR is SERVING (a member of a cluster with a leader, caught up), else 1."""
        code = run(address, timeout_s, quiet, client_config)
        if code:
            raise typer.Exit(code)

    app.command("health")(health_command)


if __name__ == "__main__":
    sys.exit(main())
