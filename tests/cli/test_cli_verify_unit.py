"""``raftbroker cluster verify`` rendering (broker/cli/render.py) from hand-made verifications."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from broker.cli import render
from broker.client import NodeDigest, ReplicaVerification

pytestmark = pytest.mark.unit


def said(found: ReplicaVerification) -> list[str]:
    out = io.StringIO()
    render.print_verify(Console(file=out, width=200), found)
    return out.getvalue().splitlines()


def test_a_differing_node_is_marked_and_named() -> None:
    found = ReplicaVerification(9, (NodeDigest("n1", True, 0xABC), NodeDigest("n2", True, 0xABC),
                                    NodeDigest("n3", True, 0xDEF)), ("n3",), False)
    lines = said(found)
    assert "00000def" in lines[3] and "DIFFERS" in lines[3] and "DIFFERS" not in lines[1]
    assert lines[-1].startswith("at index 9, n3 decided some command differently")
    assert render.verify_json(found)["nodes"][2] == {"id": "n3", "reachable": True, "digest": "00000def", "error": ""}


def test_agreement_a_silent_node_and_no_digest_at_all_are_said_apart() -> None:
    agreed = ReplicaVerification(5, (NodeDigest("n1", True, 7), NodeDigest("n2", True, 7)), (), True)
    assert said(agreed)[-1] == "every member applied the log alike through index 5"
    silent = ReplicaVerification(5, (NodeDigest("n1", True, 7), NodeDigest("n2", False, None, "did not answer")),
                                 (), False)
    assert said(silent)[-1] == "at index 5, the members that gave a digest agree; not every member gave one"
    assert render.verify_json(silent)["nodes"][1]["digest"] is None
    none = ReplicaVerification(3, (NodeDigest("n1", True, None, "this node keeps no apply digest"),), (), False)
    assert said(none)[-1].startswith("no member gave a digest (the reasons are above)")
