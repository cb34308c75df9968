"""How the SDK and CLI reach a secured cluster: TLS (a CA, optionally a client certificate) and a
bearer token, from a client config file (TOML) such as ``raftbroker dev --secure`` writes::

    bootstrap = ["127.0.0.1:7001", "127.0.0.1:7002"]   # optional: node addresses
    ca_file = "tls/ca.pem"                             # CA that signed the nodes' certificates
    cert_file = "tls/client.pem"                       # optional (mTLS), with key_file
    key_file = "tls/client-key.pem"
    token_file = "tls/admin.token"                     # or token = "..." (token_file: re-read when it changes)
    server_name = "localhost"                          # optional: the name to check in node certificates

Relative paths are relative to the config file. Used through ``Client(client_config=PATH)``,
``Client.from_config()``, the CLI's ``--client-config PATH``, or :data:`CLIENT_CONFIG_ENV`.
"""

from __future__ import annotations

import os
import socket
import ssl
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

import grpc

CLIENT_CONFIG_ENV = "RAFTBROKER_CLIENT_CONFIG"
_KEYS = {"bootstrap", "ca_file", "cert_file", "key_file", "token", "token_file", "server_name"}


class ClientConfigError(ValueError):
    """The client config file is missing or invalid; the message names the file and the setting."""


class _TokenFile:
    """The token in a file, re-read when the file changes (so a rotated token is picked up by a running client)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._token = ""

    def get(self) -> str:
        with self._lock:
            try:
                st = os.stat(self._path)
                if (st.st_mtime_ns, st.st_size) != self._stamp:
                    token = self._path.read_text().strip()
                    if token:
                        self._token, self._stamp = token, (st.st_mtime_ns, st.st_size)
            except OSError:
                pass  # keep the last token; the server says UNAUTHENTICATED if it no longer works
            return self._token


class _BearerPlugin(grpc.AuthMetadataPlugin):
    def __init__(self, token: str | _TokenFile) -> None:
        self._token = token

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        token = self._token if isinstance(self._token, str) else self._token.get()
        callback((("authorization", f"Bearer {token}"),) if token else (), None)


@dataclass(frozen=True)
class ClientSecurity:
    """TLS material (PEM bytes) and a token (literal or a file), for secure channels."""

    ca_pem: bytes | None = None  # None: the system's trusted CAs
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    token: str | None = None
    token_file: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_pem is None) != (self.key_pem is None):
            raise ClientConfigError("a client certificate and its key go together")
        if self.token is not None and self.token_file is not None:
            raise ClientConfigError("give token or token_file, not both")

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ssl = grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)
        source: str | _TokenFile | None = self.token or (_TokenFile(self.token_file) if self.token_file else None)
        if source is None:
            return ssl
        return grpc.composite_channel_credentials(ssl, grpc.metadata_call_credentials(_BearerPlugin(source)))

    def channel_options(self) -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


@dataclass(frozen=True)
class ClientConfig:
    bootstrap: tuple[str, ...]
    security: ClientSecurity


# what each PEM file of a client config must hold: (a marker of its PEM block, what it is called)
_PEM_KINDS = {"ca_file": (b"-----BEGIN CERTIFICATE-----", "certificate"),
              "cert_file": (b"-----BEGIN CERTIFICATE-----", "certificate"),
              "key_file": (b"PRIVATE KEY-----", "private key")}


def load_client_config(path: Path | str | None = None) -> ClientConfig | None:
    """The config at ``path``, else at ``$RAFTBROKER_CLIENT_CONFIG``, else None."""
    if path is None:
        path = os.environ.get(CLIENT_CONFIG_ENV) or None
        if path is None:
            return None
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ClientConfigError(f"client config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClientConfigError(f"client config {path}: {exc}") from None
    unknown = set(data) - _KEYS
    if unknown:
        raise ClientConfigError(f"client config {path}: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}")
    base = path.parent

    def read(key: str) -> bytes | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ClientConfigError(f"client config {path}: {key} must be a path")
        try:
            content = (base / value).read_bytes()
        except OSError as exc:
            raise ClientConfigError(f"client config {path}: {key} {base / value}: {exc.strerror or exc}") from None
        kind = _PEM_KINDS.get(key)
        if kind is not None and kind[0] not in content:  # else gRPC's "Failed to create security handshaker",
            # after every retry of the first call
            raise ClientConfigError(f"client config {path}: {key} {base / value} holds no PEM {kind[1]}")
        return content

    bootstrap = data.get("bootstrap", [])
    if isinstance(bootstrap, str):
        bootstrap = bootstrap.split(",")
    if not isinstance(bootstrap, list) or not all(isinstance(a, str) for a in bootstrap):
        raise ClientConfigError(f"client config {path}: bootstrap must be a list of host:port")
    token, token_file = data.get("token"), data.get("token_file")
    if not isinstance(token, str | None) or not isinstance(token_file, str | None):
        raise ClientConfigError(f"client config {path}: token and token_file must be strings")
    ca_pem, cert_pem, key_pem = read("ca_file"), read("cert_file"), read("key_file")  # each names the file itself
    if token_file is not None and not (read("token_file") or b"").strip():  # else every call: "missing credentials"
        raise ClientConfigError(f"client config {path}: token_file {base / token_file} is empty")
    try:
        security = ClientSecurity(ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem,
                                  token=token, token_file=base / token_file if token_file else None,
                                  server_name=data.get("server_name"))
    except ClientConfigError as exc:
        raise ClientConfigError(f"client config {path}: {exc}") from None
    return ClientConfig(tuple(a.strip() for a in bootstrap if a.strip()), security)


def answers_tls(address: str, timeout_s: float = 0.5) -> bool:
    """Whether the node at ``address`` (``host:port``) answers a TLS handshake: how a client that
    connects without TLS tells a node that wants TLS from a node that is down. Nothing is checked
    (only the language spoken matters), and an alert from the node (it wants a client certificate)
    counts as TLS too; a refused connection, a plaintext answer or silence does not."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock, \
                context.wrap_socket(sock, do_handshake_on_connect=False) as tls:
            tls.do_handshake()
            return True
    except ssl.SSLError as exc:
        return "alert" in str(exc).lower()  # the node spoke TLS, and refused this client
    except (OSError, ValueError):
        return False
