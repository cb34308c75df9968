"""``raftbroker cluster formats`` rendering (broker/cli/render.py) from hand-made cluster statuses:
what holds the cluster's command format back, in JSON and in words."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from broker.cli import render
from broker.client import ClusterStatus, NodeInfo

pytestmark = pytest.mark.unit


def node(node_id: str, applies: int, cluster: int, reachable: bool = True) -> NodeInfo:
    return NodeInfo(id=node_id, grpc_address=f"{node_id}:1", role="follower" if node_id != "n1" else "leader",
                    term=1, commit_index=1, applied_index=1, pid=1, reachable=reachable, leader_id="n1",
                    apply_format=applies if reachable else 0, cluster_format=cluster if reachable else 0)


def said(status: ClusterStatus) -> str:
    out = io.StringIO()
    render.print_formats(Console(file=out, width=200), status)
    return out.getvalue().splitlines()[-1]


def test_an_older_member_holds_the_format_and_is_named() -> None:
    status = ClusterStatus("n1", (node("n1", 2, 1), node("n2", 2, 1), node("n3", 1, 1)))
    assert render.formats_json(status) == {
        "cluster_format": 1, "members_apply": 1, "held_by": ["n3"],
        "nodes": [{"id": "n1", "apply_format": 2, "cluster_format": 1, "reachable": True},
                  {"id": "n2", "apply_format": 2, "cluster_format": 1, "reachable": True},
                  {"id": "n3", "apply_format": 1, "cluster_format": 1, "reachable": True}]}
    assert said(status) == "cluster format: 1; to raise it, upgrade n3"


def test_every_member_ready_and_every_member_current() -> None:
    ready = ClusterStatus("n1", (node("n1", 2, 1), node("n2", 2, 1)))
    assert render.formats_json(ready)["held_by"] == [] and "the leader raises it" in said(ready)
    current = ClusterStatus("n1", (node("n1", 2, 2), node("n2", 2, 2)))
    assert said(current) == "cluster format: 2; every member applies it and none applies a newer one"


def test_a_silent_member_is_unknown_and_without_a_leader_the_highest_view_counts() -> None:
    status = ClusterStatus("", (node("n1", 2, 2), node("n2", 2, 1), node("n3", 0, 0, reachable=False)))
    found = render.formats_json(status)
    assert found["cluster_format"] == 2 and found["members_apply"] is None and found["held_by"] == ["n3"]
    assert found["nodes"][2] == {"id": "n3", "apply_format": None, "cluster_format": None, "reachable": False}
    assert said(status).startswith("cluster format: 2; n3 not answering")
