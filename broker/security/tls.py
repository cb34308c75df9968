"""gRPC server TLS whose certificate, key and client CA are re-read when their files change.

gRPC asks :meth:`ServerTls._fetch` before each new TLS handshake; it answers a new configuration
when a file's modification time or size changed (so a renewed certificate, e.g. by cert-manager,
is served to new connections without a restart; open connections keep theirs). A broken update
(unreadable, or a key that does not load or is not the certificate's) is logged and the last good
configuration kept.
With a client CA, clients must present a certificate it signed (mTLS).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = logging.getLogger(__name__)


def _check_pair(cert_pem: bytes, key_pem: bytes, cert_file: Path, key_file: Path) -> None:
    """``ValueError`` unless the key loads and belongs to the (first) certificate: gRPC would keep
    serving the old pair silently (or, at start, fail every handshake)."""
    try:
        public = x509.load_pem_x509_certificate(cert_pem).public_key()
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{cert_file} or {key_file} does not load: {exc}") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != public.public_bytes(*spki):
        raise ValueError(f"the key {key_file} is not the key of the certificate {cert_file}")


class ServerTls:
    """Server credentials for ``cert_file``/``key_file`` (PEM), optionally requiring client certificates."""

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None = None) -> None:
        self._files = [Path(cert_file), Path(key_file), *([Path(client_ca_file)] if client_ca_file else [])]
        self._client_ca = client_ca_file is not None
        self._stamp = self._stat()
        self._initial = self._config()

    def _stat(self) -> tuple[tuple[int, int], ...]:
        out = []
        for f in self._files:
            st = os.stat(f)
            out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _config(self) -> grpc.ServerCertificateConfiguration:
        cert, key = self._files[0].read_bytes(), self._files[1].read_bytes()
        if b"-----BEGIN" not in cert or b"-----BEGIN" not in key:
            raise ValueError(f"{self._files[0]} and {self._files[1]} must be PEM")
        _check_pair(cert, key, self._files[0], self._files[1])
        root = self._files[2].read_bytes() if self._client_ca else None
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=root)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return None
            config = self._config()
        except (OSError, ValueError) as exc:
            log.error("cannot reload the TLS files (%s); serving the last good certificate", exc)
            return None
        self._stamp = stamp
        log.info("TLS certificate files changed: new connections get the new certificate")
        return config

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._initial, self._fetch,
                                                   require_client_authentication=self._client_ca)
