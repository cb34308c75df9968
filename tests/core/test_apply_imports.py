"""What every node applies reads only the internal (stored and replicated) messages: a change to
the public API cannot change what is applied, stored or replicated (issue 14, item 2)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# the apply side (deterministic, run on every node); leader-side modules may move out of broker/core
APPLY_SIDE = ["broker/core/state_machine.py", "broker/core/records.py", "broker/core/topics.py",
              "broker/core/retention.py", "broker/core/routes.py", "broker/core/dedup.py",
              "broker/core/groups/apply.py", "broker/core/groups/config.py", "broker/core/groups/cursor.py",
              "broker/core/groups/layout.py", "broker/core/groups/prune_roles.py"]
PUBLIC_STUBS = {"broker_pb2", "broker_pb2_grpc", "admin_pb2", "admin_pb2_grpc", "common_pb2", "routes_pb2",
                "routes_pb2_grpc"}


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


@pytest.mark.parametrize("module", APPLY_SIDE)
def test_the_apply_side_imports_no_public_stub(module: str) -> None:
    path = ROOT / module
    assert path.exists(), f"{module} moved: update APPLY_SIDE"
    public = {n for n in imported_names(path) if n.rsplit(".", 1)[-1] in PUBLIC_STUBS}
    assert not public, f"{module} imports the public API: {sorted(public)}"
