"""A StatefulSet gives every pod the same peer list, its own entry included: the node drops the entry
that is exactly itself (same id, Raft and gRPC address) and still rejects one that only shares its id."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import ConfigError, load_config

pytestmark = [pytest.mark.unit]

_ALL = ("n1=10.0.0.1:7100/10.0.0.1:7001,n2=10.0.0.2:7100/10.0.0.2:7001,"
        "n3=10.0.0.3:7100/10.0.0.3:7001")


def test_own_entry_in_the_full_peer_list_is_dropped() -> None:
    env = {"RAFTBROKER_NODE_ID": "n2", "RAFTBROKER_RAFT_ADDRESS": "10.0.0.2:7100",
           "RAFTBROKER_GRPC_ADDRESS": "10.0.0.2:7001", "RAFTBROKER_METRICS_ADDRESS": "0.0.0.0:7200",
           "RAFTBROKER_INSECURE": "true", "RAFTBROKER_RAFT_PASSWORD": "pw", "RAFTBROKER_PEERS": _ALL}
    cfg = load_config(None, {}, env)
    assert [p.id for p in cfg.peers] == ["n1", "n3"]


def test_an_entry_sharing_only_the_id_is_still_refused() -> None:
    env = {"RAFTBROKER_NODE_ID": "n2", "RAFTBROKER_RAFT_ADDRESS": "10.0.0.9:7100",
           "RAFTBROKER_GRPC_ADDRESS": "10.0.0.2:7001", "RAFTBROKER_METRICS_ADDRESS": "0.0.0.0:7200",
           "RAFTBROKER_INSECURE": "true", "RAFTBROKER_RAFT_PASSWORD": "pw", "RAFTBROKER_PEERS": _ALL}
    with pytest.raises(ConfigError, match="node ids must be unique"):
        load_config(None, {}, env)


def test_an_unreadable_config_file_is_a_config_error(tmp_path: Path) -> None:
    """A mounted config file the node's user cannot read (or a directory) is named, not a traceback."""
    with pytest.raises(ConfigError, match=r"config file .* cannot be read: Is a directory"):
        load_config(tmp_path, {}, {})
