"""The secrets of ``raftbroker dev --secure``: a CA, node certificates, an admin token, an ACL,
a Raft secret and a client config file, under ``DATA/tls/`` (``DATA/client.toml`` for the config).

Everything is made once and reused when the directory already has it (a restarted dev cluster
keeps its CA, so clients and data keep working). Node certificates are valid for ``localhost``,
``127.0.0.1`` and the node id, for :data:`CERT_VALIDITY_DAYS`. Private keys, the token and the
Raft secret are written mode 0600. For development only: the CA key sits next to the certificates.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.security.tokens import hash_token_sha256

CERT_VALIDITY_DAYS = 365
ADMIN_PRINCIPAL = "admin"


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(common_name: str = "raftbroker dev CA") -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a new self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CERT_VALIDITY_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def issue_cert(ca_cert_pem: bytes, ca_key_pem: bytes, common_name: str, dns_names: list[str],
               ips: list[str]) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) signed by the CA, for server and client use."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    san = [x509.DNSName(d) for d in dns_names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CERT_VALIDITY_DAYS))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


@dataclass(frozen=True)
class DevSecurity:
    """The files of a secure dev cluster (see module doc)."""

    data_dir: Path

    @property
    def tls_dir(self) -> Path:
        return self.data_dir / "tls"

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.pem"

    @property
    def tokens_file(self) -> Path:
        return self.tls_dir / "tokens.toml"

    @property
    def acl_file(self) -> Path:
        return self.tls_dir / "acl.toml"

    @property
    def admin_token_file(self) -> Path:
        return self.tls_dir / "admin.token"

    @property
    def raft_secret_file(self) -> Path:
        return self.tls_dir / "raft.secret"

    @property
    def client_config(self) -> Path:
        return self.data_dir / "client.toml"

    def node_cert(self, node_id: str) -> tuple[Path, Path]:
        return self.tls_dir / f"{node_id}.pem", self.tls_dir / f"{node_id}-key.pem"

    def admin_cert(self) -> tuple[Path, Path]:
        """The admin's client certificate and key (common name ``admin``), for mTLS."""
        return self.tls_dir / "admin.pem", self.tls_dir / "admin-key.pem"

    def admin_token(self) -> str:
        return self.admin_token_file.read_text().strip()

    def ensure(self, bootstrap: list[str]) -> DevSecurity:
        """Create whatever is missing (the CA first); write the client config for ``bootstrap``."""
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        ca_key_file = self.tls_dir / "ca-key.pem"
        if not self.ca_file.exists() or not ca_key_file.exists():
            cert, key = make_ca()
            _write(ca_key_file, key, private=True)
            _write(self.ca_file, cert)
        if not self.admin_token_file.exists():
            _write(self.admin_token_file, (secrets.token_urlsafe(32) + "\n").encode(), private=True)
        if not self.tokens_file.exists():
            _write(self.tokens_file, (f'[[token]]\nprincipal = "{ADMIN_PRINCIPAL}"\n'
                                      f'sha256 = "{hash_token_sha256(self.admin_token())}"\n').encode(), private=True)
        if not self.acl_file.exists():
            _write(self.acl_file, f'[[allow]]\nprincipals = ["{ADMIN_PRINCIPAL}"]\n'
                                  'permissions = ["cluster-admin"]\n'.encode())
        if not self.raft_secret_file.exists():
            _write(self.raft_secret_file, (secrets.token_urlsafe(32) + "\n").encode(), private=True)
        salt_file = self.tls_dir / "raft.salt"
        if not salt_file.exists():
            _write(salt_file, (secrets.token_hex(16) + "\n").encode())
        admin_cert, admin_key = self.admin_cert()
        if not admin_cert.exists() or not admin_key.exists():  # presented when a node asks for one (mTLS)
            cert, key = issue_cert(self.ca_file.read_bytes(), ca_key_file.read_bytes(), ADMIN_PRINCIPAL, [], [])
            _write(admin_key, key, private=True)
            _write(admin_cert, cert)
        addresses = ", ".join(f'"{a}"' for a in bootstrap)
        _write(self.client_config, (f"# raftbroker client config (raftbroker dev --secure)\n"
                                    f"bootstrap = [{addresses}]\n"
                                    f'ca_file = "tls/ca.pem"\ntoken_file = "tls/admin.token"\n'
                                    f'cert_file = "tls/admin.pem"\nkey_file = "tls/admin-key.pem"\n').encode())
        return self

    def raft_salt(self) -> str:
        return (self.tls_dir / "raft.salt").read_text().strip()

    def node_args(self, node_id: str) -> list[str]:
        """The ``raftbroker serve`` flags of node ``node_id`` (its certificate is made if missing)."""
        cert_file, key_file = self.node_cert(node_id)
        if not cert_file.exists() or not key_file.exists():
            cert, key = issue_cert(self.ca_file.read_bytes(), (self.tls_dir / "ca-key.pem").read_bytes(), node_id,
                                   ["localhost", node_id], ["127.0.0.1"])
            _write(key_file, key, private=True)
            _write(cert_file, cert)
        return ["--tls-cert-file", str(cert_file), "--tls-key-file", str(key_file), "--tls-ca-file", str(self.ca_file),
                "--tokens-file", str(self.tokens_file), "--acl-file", str(self.acl_file),
                "--raft-password-file", str(self.raft_secret_file), "--raft-password-salt", self.raft_salt()]
