"""Security settings of the node config: validated at start with messages naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import ConfigError, load_config

pytestmark = pytest.mark.unit


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name in ("cert.pem", "key.pem", "ca.pem", "tokens.toml", "acl.toml", "raft.secret"):
        (tmp_path / name).write_text("x\n")
        out[name] = str(tmp_path / name)
    return out


def _load(overrides: dict[str, object]) -> object:
    return load_config(None, overrides, environ={})


def test_secured_node_binds_beyond_loopback_without_insecure(files: dict[str, str]) -> None:
    cfg = _load({"grpc_address": "0.0.0.0:7001", "metrics_address": "0.0.0.0:7201",
                 "raft_address": "10.0.0.1:7101", "raft_password_file": files["raft.secret"],
                 "tls_cert_file": files["cert.pem"], "tls_key_file": files["key.pem"],
                 "tokens_file": files["tokens.toml"], "acl_file": files["acl.toml"]})
    assert cfg.authenticated  # type: ignore[attr-defined]
    assert cfg.raft_secret() == "x"  # type: ignore[attr-defined]


def test_tls_without_auth_still_needs_insecure_beyond_loopback(files: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="beyond loopback without authentication"):
        _load({"grpc_address": "0.0.0.0:7001", "tls_cert_file": files["cert.pem"], "tls_key_file": files["key.pem"]})


@pytest.mark.parametrize(("keys", "message"), [
    (("tls_cert_file",), "tls_cert_file and tls_key_file go together"),
    (("tokens_file", "acl_file"), "need TLS"),
    (("tls_cert_file", "tls_key_file", "tokens_file"), "acl_file go together"),
    (("tls_cert_file", "tls_key_file", "acl_file"), "acl_file go together"),
    (("tls_cert_file", "tls_key_file", "tls_principal_from_cert", "acl_file"), "needs tls_client_ca_file"),
    (("raft_password", "raft_password_file"), "not both"),
])
def test_inconsistent_security_settings_are_refused(files: dict[str, str], keys: tuple[str, ...],
                                                    message: str) -> None:
    paths = {"tls_cert_file": files["cert.pem"], "tls_key_file": files["key.pem"], "tokens_file": files["tokens.toml"],
             "acl_file": files["acl.toml"], "raft_password_file": files["raft.secret"],
             "tls_principal_from_cert": True, "raft_password": "pw"}
    with pytest.raises(ConfigError, match=message):
        _load({k: paths[k] for k in keys})


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tokens_file: .*nope.toml is not a readable file"):
        _load({"tokens_file": str(tmp_path / "nope.toml")})


def test_settings_come_from_the_environment(files: dict[str, str]) -> None:
    cfg = load_config(None, {}, environ={"RAFTBROKER_TLS_CERT_FILE": files["cert.pem"],
                                         "RAFTBROKER_TLS_KEY_FILE": files["key.pem"]})
    assert str(cfg.tls_cert_file) == files["cert.pem"]
