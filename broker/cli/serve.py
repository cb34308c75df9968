"""``raftbroker serve`` (one node) and ``raftbroker dev`` (a local N-node cluster)."""

from __future__ import annotations

import enum
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from broker.allocator import ENV as ALLOCATOR_ENV
from broker.allocator import Allocator, AllocatorError, choose


class LogLevel(enum.StrEnum):
    """``serve --log-level``: any other value is refused before the node starts (exit 2)."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"

if TYPE_CHECKING:  # the SDK is imported late: `raftbroker --help` stays fast
    from broker.client.security import ClientSecurity
    from broker.http.server import Gateway


def register(app: typer.Typer) -> None:
    """Add ``serve`` and ``dev`` to the CLI."""
    app.command("serve")(serve_command)
    app.command("dev")(dev_command)


def serve_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML config file")] = None,
    node_id: Annotated[str | None, typer.Option(help="This node's id")] = None,
    cluster_id: Annotated[str | None, typer.Option(help="Cluster id (stamped into record origins)")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where this node keeps its data")] = None,
    grpc: Annotated[str | None, typer.Option("--grpc", help="gRPC listen address host:port")] = None,
    raft: Annotated[str | None, typer.Option("--raft", help=(
        "Raft listen address host:port, bound exactly (no other interface). Beyond loopback it needs "
        "raft_password (config file, --raft-password-file or RAFTBROKER_RAFT_PASSWORD, the same on every "
        "node): the Raft transport is then encrypted and authenticated; and, without TLS and tokens, "
        "--insecure"))] = None,
    raft_password_salt: Annotated[str | None, typer.Option(help=(
        "Salt of the Raft password's key derivation: random, the same on every node of the cluster "
        "(also raft_password_salt / RAFTBROKER_RAFT_PASSWORD_SALT; default derived from --cluster-id)"))] = None,
    metrics: Annotated[str | None, typer.Option("--metrics", help="Prometheus metrics address host:port")] = None,
    peer: Annotated[list[str] | None, typer.Option("--peer", help="Another node: ID=RAFT_HOST:PORT/GRPC_HOST:PORT",
                                                   show_default=False)] = None,
    max_record_bytes: Annotated[int | None, typer.Option(help="Largest record accepted")] = None,
    adopt_data_dir: Annotated[bool, typer.Option("--adopt-data-dir", help=(
        "Take over a data directory recorded as another node's or cluster's (a restored copy); only for a "
        "node started alone, without peers (docs/deploy.md, 'Back up and restore')"))] = False,
    insecure: Annotated[bool, typer.Option("--insecure", help="Allow a non-loopback bind without auth")] = False,
    tls_cert_file: Annotated[Path | None, typer.Option(
        help="TLS: this node's PEM certificate chain (re-read on change)", rich_help_panel="Security")] = None,
    tls_key_file: Annotated[Path | None, typer.Option(help="TLS: its PEM private key", rich_help_panel="Security")]
    = None,
    tls_client_ca_file: Annotated[Path | None, typer.Option(
        help="mTLS: clients must present a certificate this CA signed", rich_help_panel="Security")] = None,
    tls_ca_file: Annotated[Path | None, typer.Option(
        help="CA of the other nodes' certificates (default: the client CA)", rich_help_panel="Security")] = None,
    tls_principal_from_cert: Annotated[bool, typer.Option(
        "--tls-principal-from-cert", help="A call without a token is its client certificate's common name",
        rich_help_panel="Security")] = False,
    tokens_file: Annotated[Path | None, typer.Option(
        help="Bearer tokens → principals, hashed (TOML, re-read on change)", rich_help_panel="Security")] = None,
    acl_file: Annotated[Path | None, typer.Option(
        help="Grants per principal, topic and group (TOML, re-read on change)", rich_help_panel="Security")] = None,
    raft_password_file: Annotated[Path | None, typer.Option(
        help="File holding the Raft password (instead of raft_password)", rich_help_panel="Security")] = None,
    route_client_config: Annotated[Path | None, typer.Option(
        help="Client config (TLS, token) routes use towards secured clusters", rich_help_panel="Security")] = None,
    http: Annotated[str | None, typer.Option("--http", help=(
        "Also serve the HTTP/JSON gateway (/v1, SSE, /openapi.json) on HOST:PORT, in this process"))] = None,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False, help="Least severe level logged")]
    = LogLevel.INFO,
    allocator: Annotated[Allocator, typer.Option(envvar=ALLOCATOR_ENV, help=(
        "Memory allocator: auto (jemalloc when the system has it, else glibc's), jemalloc (refuse to start "
        "without it) or system. The node re-executes itself once, same PID, with jemalloc preloaded"))]
    = Allocator.AUTO,
) -> None:
    """Run one broker node until SIGTERM or Ctrl-C (config: file < RAFTBROKER_* env < flags)."""
    try:
        allocator_line = choose(allocator)  # first: it may re-execute this process
    except AllocatorError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(level=log_level.value, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("broker.node").info("%s", allocator_line)
    from broker.config import ConfigError, PeerConfig, load_config  # pydantic: imported when it serves

    try:
        overrides = {
            "node_id": node_id, "cluster_id": cluster_id, "data_dir": data_dir, "grpc_address": grpc,
            "raft_address": raft, "metrics_address": metrics, "max_record_bytes": max_record_bytes,
            "insecure": insecure or None, "raft_password_salt": raft_password_salt,
            "tls_cert_file": tls_cert_file, "tls_key_file": tls_key_file, "tls_client_ca_file": tls_client_ca_file,
            "tls_ca_file": tls_ca_file, "tls_principal_from_cert": tls_principal_from_cert or None,
            "tokens_file": tokens_file, "acl_file": acl_file, "raft_password_file": raft_password_file,
            "route_client_config": route_client_config, "adopt_data_dir": adopt_data_dir or None,
            "peers": [PeerConfig.parse(p).model_dump() for p in peer] if peer else None,
        }
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    from broker.core.formats import DataFormatTooNew
    from broker.data_dir import DataDirIdentityDamaged, DataDirUnusable
    from broker.node import serve  # imported late: `raftbroker --help` stays fast
    from broker.replication import ReplicaDataDamaged
    from broker.security.node import SecuritySettingsError, gateway_security
    from broker.services.binding import BindFailed
    from broker.storage import StoreCorruption

    gateway = None
    if http is not None:
        try:
            security = gateway_security(cfg)
        except SecuritySettingsError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        gateway = start_http(http, cfg.grpc_address, [p.grpc_address for p in cfg.peers], cfg.insecure,
                             security, batch_bytes_max=cfg.max_batch_bytes)

    try:
        serve(cfg)
    except (StoreCorruption, ReplicaDataDamaged, DataFormatTooNew, DataDirIdentityDamaged) as exc:  # a damaged
        # store file, Raft journal or identity file, or a downgrade past the cluster's command format, at
        # start: say which and what to do
        logging.getLogger("broker.node").critical("refusing to start: %s", exc)
        typer.echo(f"error: refusing to start: {exc}", err=True)
        raise typer.Exit(3) from None
    except (BindFailed, SecuritySettingsError, DataDirUnusable) as exc:  # a port in use, an address not on
        # this host, a TLS, tokens or ACL file or a data directory that cannot be used or is another node's:
        # exit 2, as for a bad setting (the data is fine, unlike exit 3)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        if gateway is not None and not gateway.stop():
            logging.getLogger("broker.http").warning("the HTTP gateway did not stop within 10 s")


def start_http(address: str, grpc_address: str, peers: list[str], insecure: bool,
               security: ClientSecurity | None = None, batch_bytes_max: int | None = None) -> Gateway:
    """Start the HTTP gateway beside this node (exit 2 on a bad, exposed or taken address: uvicorn
    binds on its own thread and only logs a failure, which left the node running without it). Its
    body cap lets through every batch of ``batch_bytes_max`` (this node's ``max_batch_bytes``)."""
    from broker.config import is_loopback
    from broker.http.body_limit import BODY_BYTES_MAX, body_bytes_max
    from broker.http.server import parse_address, start_in_thread
    from broker.services.binding import bind_error

    try:
        parse_address(address)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if not is_loopback(address) and not insecure:
        typer.echo(f"error: --http {address} is not a loopback address: add --insecure to expose it", err=True)
        raise typer.Exit(2)
    taken = bind_error(address)
    if taken:
        typer.echo(f"error: cannot listen on {address}, the HTTP gateway's address (--http): {taken}", err=True)
        raise typer.Exit(2)
    cap = BODY_BYTES_MAX if batch_bytes_max is None else max(BODY_BYTES_MAX, body_bytes_max(batch_bytes_max))
    return start_in_thread(address, [grpc_address, *peers], security, body_bytes_max=cap)


def dev_command(
    nodes: Annotated[int, typer.Option(min=1, max=9, help="Number of nodes")] = 3,
    data_dir: Annotated[Path, typer.Option(help="Data directory (one sub-directory per node)")] = Path(".raftbroker"),
    base_port: Annotated[int, typer.Option(min=1024, max=65000, help=(
        "gRPC port of node 1; Raft +100, metrics +200, HTTP +300"))]
    = 7001,
    ready_timeout_s: Annotated[float, typer.Option(help="How long to wait for a leader")] = 60.0,
    secure: Annotated[bool, typer.Option("--secure", help=(
        "TLS, tokens and ACLs: generate a CA, node certificates, an admin token and a client config "
        "under DATA_DIR (reused when present) and print 'client config: PATH'"))] = False,
    cluster_id: Annotated[str, typer.Option(help=(
        "The cluster's id, stamped into record origins; give a second local cluster another one "
        "(with its own --base-port and --data-dir) to mirror between them with routes"))] = "local",
) -> None:
    """Start a local cluster of NODES separate processes on 127.0.0.1; Ctrl-C stops them all cleanly."""
    from broker.config import ID_RE, ID_RULE
    from broker.devcluster import DevCluster

    if not ID_RE.fullmatch(cluster_id):
        raise typer.BadParameter(f"must be {ID_RULE}, got {cluster_id!r}", param_hint="--cluster-id")
    security = None
    if secure:
        from broker.security.devcerts import DevSecurity

        security = DevSecurity(data_dir)
    cluster = DevCluster(nodes, data_dir, base_port, security=security, http=True,
                         extra_args=["--cluster-id", cluster_id] if cluster_id != "local" else [])
    signals: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)  # no lock in a handler (see broker.node.serve)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
    except OSError as exc:  # the data directory cannot be made (a path under /proc, a file there already)
        cluster.stop()
        typer.echo(f"error: data directory {data_dir}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    try:
        try:
            cluster.wait_ready(ready_timeout_s)
        except (TimeoutError, RuntimeError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        print(f"cluster ready: {','.join(cluster.addresses)}", flush=True)
        for i in range(nodes):
            print(f"  {cluster.node_id(i)}: grpc {cluster.grpc_address(i)}  raft {cluster.raft_address(i)}  "
                  f"metrics http://{cluster.metrics_address(i)}/metrics  http http://{cluster.http_address(i)}  "
                  f"pid {cluster.pids[i]}  "
                  f"log {cluster.log_path(i)}", flush=True)
        if security is not None:
            print(f"client config: {security.client_config.resolve()}", flush=True)
        reported: set[int] = set()
        while not signals:
            time.sleep(0.5)
            for i, proc in enumerate(cluster.procs):
                if i not in reported and proc is not None and proc.poll() is not None:
                    reported.add(i)
                    print(f"node {cluster.node_id(i)} (pid {proc.pid}) exited with code {proc.returncode}; "
                          f"not restarting it (see {cluster.log_path(i)})", file=sys.stderr, flush=True)
    finally:
        print("stopping the cluster...", flush=True)
        cluster.stop()
        print("stopped", flush=True)
