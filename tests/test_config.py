"""Configuration: file < environment < flags, validated with messages naming the setting."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest

from broker.config import ConfigError, NodeConfig, PeerConfig, load_config
from broker.node import raft_options
from broker.replication.raft import RaftOptions

pytestmark = pytest.mark.unit


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = tmp_path / "n.toml"
    f.write_text('node_id = "file"\ngrpc_address = "127.0.0.1:9001"\nmax_record_bytes = 100\n'
                 '[[peers]]\nid = "n2"\nraft_address = "127.0.0.1:9102"\ngrpc_address = "127.0.0.1:9002"\n')
    cfg = load_config(f, {"node_id": None}, environ={"RAFTBROKER_NODE_ID": "env"})
    assert cfg.node_id == "env" and cfg.grpc_address == "127.0.0.1:9001" and cfg.max_record_bytes == 100
    assert cfg.peers[0].id == "n2"
    cfg = load_config(f, {"node_id": "flag"}, environ={"RAFTBROKER_NODE_ID": "env"})
    assert cfg.node_id == "flag"


@pytest.mark.parametrize("overrides, fragment", [
    ({"grpc_address": "nowhere"}, "grpc_address"),
    ({"grpc_address": "127.0.0.1:99999"}, "grpc_address"),
    ({"max_record_bytes": -1}, "max_record_bytes"),
    ({"grpc_address": "0.0.0.0:7001"}, "--insecure"),
    ({"metrics_address": "0.0.0.0:7201"}, "--insecure"),
    ({"metrics_address": "10.1.2.3:7201"}, "10.1.2.3:7201"),
    ({"raft_address": "10.0.0.1:7101", "insecure": True}, "raft_password_file"),  # both ways of giving it are named
    ({"raft_password": "pw", "raft_password_salt": ""}, "raft_password_salt"),
    ({"peers": [{"id": "n1", "raft_address": "127.0.0.1:1", "grpc_address": "127.0.0.1:2"}]}, "unique"),
    ({"unknown_setting": 1}, "unknown_setting"),
    ({"cluster_id": "eu/west"}, "cluster_id"),  # origins are "<cluster_id>/<node_id>": routes read up to the "/"
    ({"cluster_id": ""}, "cluster_id"),
    ({"node_id": "n 1"}, "node_id"),  # as AddNode refuses it
    ({"peers": [{"id": "n=2", "raft_address": "127.0.0.1:1", "grpc_address": "127.0.0.1:2"}]}, "id must be"),
    ({"raft_election_timeout_min_s": 0.1}, "raft_election_timeout_min_s"),
    ({"raft_journal_direct_write_min_bytes": -1}, "raft_journal_direct_write_min_bytes"),
    ({"raft_journal_direct_write_min_bytes": "lots"}, "raft_journal_direct_write_min_bytes"),
    ({"store_compression": "gzip"}, "store_compression"),
    ({"raft_election_timeout_min_s": 1.0, "raft_election_timeout_max_s": 1.0}, "must exceed raft_election_timeout_min"),
    ({"raft_election_timeout_min_s": 2.0, "raft_election_timeout_max_s": 4.0}, "raft_connection_timeout_s must be"),
])
def test_invalid_settings_are_named(overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides, environ={})
    assert fragment in str(info.value)


def test_a_non_loopback_metrics_address_is_accepted_with_insecure() -> None:
    cfg = load_config(None, {"metrics_address": "0.0.0.0:7201", "insecure": True}, environ={})
    assert cfg.metrics_address == "0.0.0.0:7201"


def test_peer_flag_syntax() -> None:
    peer = PeerConfig.parse("n2=127.0.0.1:7102/127.0.0.1:7002")
    assert (peer.id, peer.raft_address, peer.grpc_address) == ("n2", "127.0.0.1:7102", "127.0.0.1:7002")
    with pytest.raises(ConfigError):
        PeerConfig.parse("n2:127.0.0.1:7102")


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml", {}, environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("node_id = ")
    with pytest.raises(ConfigError, match="bad.toml"):
        load_config(bad, {}, environ={})


def test_the_operations_guide_shows_every_default_as_the_node_has_it() -> None:
    """docs/operations.md's example node.toml gives each setting's default, bar the node's own names
    and addresses. It said raft_journal_direct_write_min_bytes = 524288 while the node had 65536
    (bench/NOTE.md, 2026-12-04 19:20 and 20:45)."""
    guide = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    found = re.search(r"```toml\n# node.toml\n(.*?)```", guide, re.S)
    assert found is not None, "docs/operations.md has no node.toml example"
    shown = tomllib.loads(found.group(1))
    own = {"node_id", "cluster_id", "data_dir", "grpc_address", "raft_address", "metrics_address", "peers"}
    assert {k for k in shown if k not in NodeConfig.model_fields} == set()
    wrong = {k: (v, NodeConfig.model_fields[k].default) for k, v in shown.items()
             if k not in own and v != NodeConfig.model_fields[k].default}
    assert wrong == {}, f"(shown, default) of each setting shown wrong: {wrong}"


def test_the_node_runs_the_replication_layers_defaults_unless_a_setting_says_otherwise() -> None:
    """A node with default settings passes every Raft option at the replication layer's own default,
    so tests built on ``RaftOptions()`` run what a node runs; only the options the node derives from
    other settings (the password's salt, the command limit) differ."""
    node = raft_options(load_config(None, {}, environ={}))
    default = RaftOptions()
    differ = {f.name for f in dataclasses.fields(RaftOptions) if getattr(node, f.name) != getattr(default, f.name)}
    assert differ == {"password_salt", "max_command_bytes"}, differ
