"""The client config file (SDK and CLI): parsing, relative paths, errors naming the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from broker.cli.main import app
from broker.client import ClientConfigError, load_client_config
from broker.client.security import _TokenFile

pytestmark = pytest.mark.unit

CERT = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"  # the loader checks the kind only
KEY = b"-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"


def test_paths_are_relative_to_the_file_and_bootstrap_is_read(tmp_path: Path) -> None:
    (tmp_path / "tls").mkdir()
    (tmp_path / "tls" / "ca.pem").write_bytes(CERT)
    (tmp_path / "tls" / "token").write_text("tok\n")
    config = tmp_path / "client.toml"
    config.write_text('bootstrap = ["h1:1", "h2:2"]\nca_file = "tls/ca.pem"\ntoken_file = "tls/token"\n')
    loaded = load_client_config(config)
    assert loaded is not None
    assert loaded.bootstrap == ("h1:1", "h2:2")
    assert loaded.security.ca_pem == CERT and loaded.security.token_file == tmp_path / "tls" / "token"


def test_environment_variable_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.toml"
    config.write_text('bootstrap = "h1:1,h2:2"\ntoken = "t"\n')
    monkeypatch.setenv("RAFTBROKER_CLIENT_CONFIG", str(config))
    loaded = load_client_config()
    assert loaded is not None and loaded.bootstrap == ("h1:1", "h2:2") and loaded.security.token == "t"
    monkeypatch.delenv("RAFTBROKER_CLIENT_CONFIG")
    assert load_client_config() is None


@pytest.mark.parametrize(("text", "message"), [
    ('ca_file = "missing.pem"\n', "ca_file .*missing.pem"),
    ('cert_file = "cert.pem"\n', "certificate and its key go together"),
    ('ca_file = "key.pem"\n', "ca_file .*key.pem holds no PEM certificate"),  # was a handshake failure per call
    ('cert_file = "key.pem"\nkey_file = "key.pem"\n', "cert_file .*key.pem holds no PEM certificate"),
    ('cert_file = "cert.pem"\nkey_file = "cert.pem"\n', "key_file .*cert.pem holds no PEM private key"),
    ('token = "a"\ntoken_file = "c.toml"\n', "token or token_file, not both"),
    ('token_file = "missing.token"\n', "token_file .*missing.token: No such file"),
    ('token_file = "empty.token"\n', "token_file .*empty.token is empty"),
    ('tokens = "a"\n', "unknown key"),
    ("bootstrap = [1]\n", "bootstrap must be a list"),
    ("bootstrap = [\n", "client config"),
])
def test_errors_name_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(text)
    (tmp_path / "empty.token").write_text("\n")
    (tmp_path / "cert.pem").write_bytes(CERT)
    (tmp_path / "key.pem").write_bytes(KEY)
    with pytest.raises(ClientConfigError, match=message) as raised:
        load_client_config(config)
    assert str(raised.value).count("client config") == 1, "the file is named once"


def test_cli_reports_a_broken_client_config_as_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--client-config", str(tmp_path / "nope.toml"), "topic", "list"])
    assert result.exit_code == 2
    assert "client config" in result.output and "nope.toml" in result.output


def test_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    token = _TokenFile(path)
    assert token.get() == "one"
    path.write_text("two-longer\n")
    assert token.get() == "two-longer"
    path.unlink()
    assert token.get() == "two-longer"  # a vanished file keeps the last token
