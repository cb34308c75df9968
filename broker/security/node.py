"""What a node's gRPC server and its node-to-node calls need from the security settings."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import grpc

from broker.client.security import ClientSecurity, load_client_config
from broker.security.acl import Acl
from broker.security.interceptor import AuthInterceptor, Guard
from broker.security.tls import ServerTls
from broker.security.tokens import TokenStore

if TYPE_CHECKING:
    from broker.config import NodeConfig

P = ParamSpec("P")
T = TypeVar("T")


class SecuritySettingsError(ValueError):
    """A file the node's security settings name cannot be used (missing, unreadable, malformed, a
    key that is not its certificate's): ``raftbroker serve`` says so in one line and exits 2."""


def _settings_files(build: Callable[P, T]) -> Callable[P, T]:
    """``build``'s OSError or ValueError about a settings file as :class:`SecuritySettingsError`."""
    @functools.wraps(build)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return build(*args, **kwargs)
        except SecuritySettingsError:
            raise
        except (OSError, ValueError) as exc:
            raise SecuritySettingsError(f"security settings: {exc}") from None
    return wrapper


@dataclass
class ServerSecurity:
    """``credentials``: None for a plaintext port. ``interceptors``: the auth interceptor, if any.
    ``peer_channel``: how this node opens a channel to another node's gRPC address."""

    credentials: grpc.ServerCredentials | None
    interceptors: list[grpc.aio.ServerInterceptor] = field(default_factory=list)
    peer_channel: Callable[..., grpc.Channel] = grpc.insecure_channel


def _peer_channel(config: NodeConfig) -> Callable[..., grpc.Channel]:
    ca_file = config.tls_ca_file or config.tls_client_ca_file
    root = Path(ca_file).read_bytes() if ca_file else None  # None: the system's trusted CAs
    key = cert = None
    if config.tls_client_ca_file is not None:  # mTLS: a node presents its own certificate to its peers
        assert config.tls_cert_file is not None and config.tls_key_file is not None
        key, cert = Path(config.tls_key_file).read_bytes(), Path(config.tls_cert_file).read_bytes()
    credentials = grpc.ssl_channel_credentials(root, key, cert)
    def channel(address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        return grpc.secure_channel(address, credentials, options=options)

    return channel


@_settings_files
def gateway_security(config: NodeConfig) -> ClientSecurity | None:
    """What this node's HTTP gateway presents to the nodes (None: plaintext): the peers' CA and, with
    mTLS, the node's own certificate, like :func:`_peer_channel`. No token of its own: the gateway
    passes each caller's ``Authorization: Bearer`` through, so the caller's principal is checked."""
    if config.tls_cert_file is None:
        return None
    ca_file = config.tls_ca_file or config.tls_client_ca_file
    key = cert = None
    if config.tls_client_ca_file is not None:
        assert config.tls_cert_file is not None and config.tls_key_file is not None
        key, cert = Path(config.tls_key_file).read_bytes(), Path(config.tls_cert_file).read_bytes()
    return ClientSecurity(ca_pem=Path(ca_file).read_bytes() if ca_file else None, cert_pem=cert, key_pem=key)


@_settings_files
def server_security(config: NodeConfig) -> ServerSecurity | None:
    """None when the node serves plaintext without authentication (the loopback dev default)."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    tls = ServerTls(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
    interceptors: list[grpc.aio.ServerInterceptor] = []
    if config.authenticated:
        assert config.acl_file is not None
        tokens = TokenStore(config.tokens_file) if config.tokens_file is not None else None
        guard = Guard(tokens, Acl(config.acl_file), principal_from_cert=config.tls_principal_from_cert)
        interceptors.append(AuthInterceptor(guard))
    return ServerSecurity(tls.credentials(), interceptors, _peer_channel(config))


@_settings_files
def route_security(config: NodeConfig) -> ClientSecurity | None:
    """What this node's routers present to other clusters (``route_client_config``), else None."""
    if config.route_client_config is None:
        return None
    loaded = load_client_config(config.route_client_config)
    return loaded.security if loaded is not None else None
