"""Server TLS files re-read on change: a key that is not the certificate's keeps the last good pair,
and says so (in-process; grpc builds the configuration, no server runs)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from broker.security.devcerts import issue_cert, make_ca
from broker.security.tls import ServerTls

pytestmark = pytest.mark.unit


def _pair(tmp_path: Path) -> tuple[Path, Path, tuple[bytes, bytes]]:
    ca_cert, ca_key = make_ca()
    cert, key = issue_cert(ca_cert, ca_key, "n1", ["localhost"], ["127.0.0.1"])
    cert_file, key_file = tmp_path / "n1.pem", tmp_path / "n1-key.pem"
    cert_file.write_bytes(cert)
    key_file.write_bytes(key)
    return cert_file, key_file, issue_cert(ca_cert, ca_key, "n1", ["localhost"], ["127.0.0.1"])


def _touch(path: Path, ns: int) -> None:
    os.utime(path, ns=(ns, ns))  # a different mtime even on a coarse clock


def test_a_key_that_is_not_the_certificates_keeps_the_last_good_pair(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    cert_file, key_file, (new_cert, new_key) = _pair(tmp_path)
    tls = ServerTls(cert_file, key_file)
    assert tls._fetch() is None, "unchanged"
    key_file.write_bytes(new_key)  # the new key first: the files disagree until the certificate follows
    _touch(key_file, 1)
    with caplog.at_level(logging.INFO, logger="broker.security.tls"):
        assert tls._fetch() is None, "a mismatched pair is not served"
    assert "is not the key of the certificate" in caplog.text and "last good" in caplog.text
    assert "new connections get the new certificate" not in caplog.text
    cert_file.write_bytes(new_cert)
    _touch(cert_file, 2)
    assert tls._fetch() is not None, "the matching pair is served"


def test_a_mismatched_pair_is_refused_at_start(tmp_path: Path) -> None:
    cert_file, key_file, (_, other_key) = _pair(tmp_path)
    key_file.write_bytes(other_key)
    with pytest.raises(ValueError, match="is not the key of the certificate"):
        ServerTls(cert_file, key_file)
    key_file.write_bytes(b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ValueError, match="does not load"):
        ServerTls(cert_file, key_file)
