"""broker.data_dir: a data directory records whose it is, and a start as another node or cluster is refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from broker.data_dir import (
    IDENTITY_FILE,
    DataDirIdentityDamaged,
    DataDirNotOurs,
    Identity,
    claim,
    read_identity,
    restore_history_end,
    restoring,
)
from broker.data_dir import restored as restored_copy

pytestmark = pytest.mark.unit

N1 = Identity("prod", "n1")


def test_a_new_directory_records_its_node_and_cluster(tmp_path: Path) -> None:
    claim(tmp_path, N1, adopt=False, alone=False)
    assert read_identity(tmp_path) == N1
    doc = json.loads((tmp_path / IDENTITY_FILE).read_text())
    assert doc["format"] == 1 and doc["cluster_id"] == "prod" and doc["node_id"] == "n1"
    assert [p.name for p in tmp_path.iterdir()] == [IDENTITY_FILE]  # no staging file left behind
    claim(tmp_path, N1, adopt=False, alone=False)  # its own directory again: fine
    claim(tmp_path, N1, adopt=True, alone=False)  # adopting its own directory changes nothing, peers or not


def test_a_directory_of_an_older_version_is_recorded_as_this_nodes(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "raft").mkdir()
    with caplog.at_level(logging.INFO, logger="broker.data_dir"):
        claim(tmp_path, N1, adopt=False, alone=False)
    assert read_identity(tmp_path) == N1
    assert "recorded its identity (node 'n1' of cluster 'prod')" in caplog.text


@pytest.mark.parametrize("other", [Identity("prod", "n2"), Identity("staging", "n1"), Identity("staging", "n2")])
def test_another_nodes_or_clusters_directory_is_refused_and_left_as_it_is(tmp_path: Path, other: Identity) -> None:
    claim(tmp_path, N1, adopt=False, alone=False)
    before = (tmp_path / IDENTITY_FILE).read_bytes()
    for alone in (False, True):
        with pytest.raises(DataDirNotOurs) as err:
            claim(tmp_path, other, adopt=False, alone=alone)
        message = str(err.value)
        assert f"belongs to node 'n1' of cluster 'prod', not to this node, {other}" in message
        assert "--adopt-data-dir" in message
        assert ("cluster was renamed on purpose" in message) == (other.node_id == "n1")
    assert (tmp_path / IDENTITY_FILE).read_bytes() == before


def test_adopting_a_copy_is_for_a_node_started_alone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    claim(tmp_path, N1, adopt=False, alone=False)
    restored = Identity("restored", "r1")
    with pytest.raises(DataDirNotOurs, match="only for a node started alone, without peers"):
        claim(tmp_path, restored, adopt=True, alone=False)
    assert read_identity(tmp_path) == N1
    with caplog.at_level(logging.WARNING, logger="broker.data_dir"):
        claim(tmp_path, restored, adopt=True, alone=True)
    assert read_identity(tmp_path) == restored
    assert "adopted as node 'r1' of cluster 'restored'; it was node 'n1' of cluster 'prod'" in caplog.text
    claim(tmp_path, restored, adopt=False, alone=False)  # from now on it is the restored node's
    # the copy's Raft history is not counted until the restored node's own snapshot (broker/data_dir.py)
    assert restoring(tmp_path)
    assert restore_history_end(tmp_path, 812) == 812  # the first start records where the history ends
    assert restore_history_end(tmp_path, 900) == 812  # a later start keeps it: 813.. are the new cluster's
    restored_copy(tmp_path)
    assert not restoring(tmp_path)
    claim(tmp_path, restored, adopt=True, alone=True)  # its own directory: nothing to adopt again
    assert not restoring(tmp_path)


@pytest.mark.parametrize("content", [
    b"", b"{", b"\xff\xfe", b"[]", b'{"format": 2, "cluster_id": "c", "node_id": "n"}',
    b'{"format": 1, "node_id": "n1"}', b'{"format": 1, "cluster_id": "", "node_id": "n1"}',
    b'{"format": 1, "cluster_id": "prod", "node_id": 7}'])
def test_a_damaged_identity_file_is_named_and_never_overwritten(tmp_path: Path, content: bytes) -> None:
    (tmp_path / IDENTITY_FILE).write_bytes(content)
    for adopt, alone in ((False, False), (True, True)):
        with pytest.raises(DataDirIdentityDamaged, match=f"{tmp_path / IDENTITY_FILE}: damaged") as err:
            claim(tmp_path, N1, adopt=adopt, alone=alone)
        assert "remove the file" in str(err.value)
    assert (tmp_path / IDENTITY_FILE).read_bytes() == content
