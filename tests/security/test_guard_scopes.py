"""The guard's edges: calls whose empty group means every group, the HTTP gateway's calls under
certificate principals, and a watched file that disappears (in-process)."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from broker.security import VIA_GATEWAY_METADATA
from broker.security.acl import Acl
from broker.security.interceptor import METHOD_RULES, Denied, Guard
from broker.security.tokens import TokenStore, hash_token_sha256
from broker.security.watched import WatchedFile
from broker.v1 import admin_pb2

pytestmark = pytest.mark.unit

ACL = '''
[[allow]]
principals = ["bob"]
permissions = ["admin"]
topics = ["orders"]
groups = ["billing-*"]

[[allow]]
principals = ["ops"]
permissions = ["admin"]
topics = ["orders"]

[[allow]]
principals = ["*"]
permissions = ["publish", "consume"]
topics = ["orders"]
'''


class FakeContext:
    """What the guard reads of a call: its metadata and the verified client certificate's name."""

    def __init__(self, metadata: tuple[tuple[str, str], ...] = (), common_name: str | None = None) -> None:
        self._metadata = metadata
        self._common_name = common_name

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_common_name": [self._common_name.encode()]} if self._common_name else {}


def _guard(tmp_path: Path, principal_from_cert: bool = False) -> Guard:
    (tmp_path / "acl.toml").write_text(ACL)
    (tmp_path / "tokens.toml").write_text(f'[[token]]\nprincipal = "alice"\nsha256 = "{hash_token_sha256("tok-a")}"\n')
    return Guard(TokenStore(tmp_path / "tokens.toml"), Acl(tmp_path / "acl.toml"), principal_from_cert)


@pytest.mark.parametrize("method", ["PauseGroups", "ResumeGroups"])
def test_every_group_of_a_topic_needs_a_grant_for_every_group(tmp_path: Path, method: str) -> None:
    """An empty group pauses or resumes every group of the topic: a grant limited to some groups
    must not reach the others through it."""
    guard = _guard(tmp_path)
    full = f"/broker.v1.Admin/{method}"
    rule = METHOD_RULES[full]
    assert guard.authorise("bob", full, rule, admin_pb2.PauseGroupsRequest(topic="orders", group="billing-1"))
    with pytest.raises(Denied) as denied:
        guard.authorise("bob", full, rule, admin_pb2.PauseGroupsRequest(topic="orders"))
    assert denied.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "lacks the 'admin' permission on group:orders/*" in str(denied.value)
    assert guard.authorise("ops", full, rule, admin_pb2.PauseGroupsRequest(topic="orders")) == "group:orders/*"


def test_a_gateway_call_is_never_the_principal_of_the_nodes_certificate(tmp_path: Path) -> None:
    """With mTLS the gateway presents its node's certificate: an HTTP caller without a token must not
    become that node's principal (and get every grant of "*")."""
    guard = _guard(tmp_path, principal_from_cert=True)
    assert guard.authenticate(FakeContext(common_name="n1")) == "n1"  # a direct mTLS client
    with pytest.raises(Denied) as denied:
        guard.authenticate(FakeContext(((VIA_GATEWAY_METADATA, "1"),), common_name="n1"))
    assert denied.value.code == grpc.StatusCode.UNAUTHENTICATED and "missing credentials" in str(denied.value)
    via_gateway = ((VIA_GATEWAY_METADATA, "1"), ("authorization", "Bearer tok-a"))
    assert guard.authenticate(FakeContext(via_gateway, common_name="n1")) == "alice"


def test_a_vanished_file_is_logged_once_and_the_last_good_kept(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "acl.toml"
    path.write_text("x = 1\n")
    watched = WatchedFile(path, lambda text: text)
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="broker.security.watched"):
        for _ in range(100):  # one call each
            assert watched.get() == "x = 1\n"
    assert len([r for r in caplog.records if "cannot read" in r.getMessage()]) == 1, "not once per call"
    path.write_text("y = 2\n")
    assert watched.get() == "y = 2\n"
    path.unlink()
    with caplog.at_level(logging.ERROR, logger="broker.security.watched"):
        assert watched.get() == "y = 2\n"
    assert len([r for r in caplog.records if "cannot read" in r.getMessage()]) == 2, "once more: it vanished again"


def test_a_broken_file_at_start_is_named(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text("garbage [\n")
    with pytest.raises(ValueError, match=f"invalid {path}: Expected '='"):
        Acl(path)
    path.write_text('[[allow]]\nprincipals = ["a"]\npermissions = ["write"]\n')
    with pytest.raises(ValueError, match=f"invalid {path}: allow 1: unknown permission"):
        Acl(path)
