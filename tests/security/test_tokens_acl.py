"""Token file parsing and authentication, ACL matching, and the method table (in-process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.protowire import Received
from broker.security.acl import Acl, parse_acl
from broker.security.interceptor import DEFAULT_RULE, METHOD_RULES, request_resource
from broker.security.tokens import AuthenticationError, TokenStore, hash_token_scrypt, hash_token_sha256, parse_tokens
from broker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc, routes_pb2

pytestmark = pytest.mark.unit


def _tokens(tmp: Path, text: str) -> Path:
    path = tmp / "tokens.toml"
    path.write_text(text)
    return path


def test_token_file_sha256_scrypt_and_expiry(tmp_path: Path) -> None:
    text = (f'[[token]]\nprincipal = "alice"\nsha256 = "{hash_token_sha256("tok-a")}"\n'
            f'[[token]]\nprincipal = "bob"\nscrypt = "{hash_token_scrypt("tok-b", n=1024)}"\n'
            f'[[token]]\nprincipal = "carol"\nsha256 = "{hash_token_sha256("tok-c")}"\n'
            'expires_at = 2030-01-01T00:00:00Z\n')
    now = [1_800_000_000.0]  # 2027: before carol's expiry
    store = TokenStore(_tokens(tmp_path, text), clock_s=lambda: now[0])
    assert store.authenticate("tok-a") == "alice"
    assert store.authenticate("tok-b") == "bob"
    assert store.authenticate("tok-b") == "bob"  # the remembered scrypt match
    assert store.authenticate("tok-c") == "carol"
    now[0] = 1_900_000_000.0  # 2030: expired
    with pytest.raises(AuthenticationError, match="'carol' has expired"):
        store.authenticate("tok-c")
    with pytest.raises(AuthenticationError, match="unknown bearer token"):
        store.authenticate("tok-x")
    with pytest.raises(AuthenticationError, match="empty"):
        store.authenticate("")


def test_token_file_is_reloaded_and_a_broken_update_keeps_the_last_good(tmp_path: Path) -> None:
    path = _tokens(tmp_path, f'[[token]]\nprincipal = "alice"\nsha256 = "{hash_token_sha256("old")}"\n')
    store = TokenStore(path)
    assert store.authenticate("old") == "alice"
    path.write_text(f'[[token]]\nprincipal = "alice"\nsha256 = "{hash_token_sha256("new")}"\n')
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    assert store.authenticate("new") == "alice"
    with pytest.raises(AuthenticationError):
        store.authenticate("old")
    path.write_text("[[token]\nbroken")
    assert store.authenticate("new") == "alice"


@pytest.mark.parametrize(("text", "message"), [
    ('[[token]]\nprincipal = "a"\n', "exactly one of sha256 and scrypt"),
    ('[[token]]\nprincipal = "a"\nsha256 = "zz"\n', "64 hex digits"),
    ('[[token]]\nprincipal = "a b"\nsha256 = "' + "0" * 64 + '"\n', "principal must match"),
    ('[[token]]\nprincipal = "a"\nsha256 = "' + "0" * 64 + '"\nexpires_at = 2030-01-01T00:00:00\n', "with a zone"),
    ('[[token]]\nprincipal = "a"\nscrypt = "3$8$1$00$' + "00" * 16 + '"\n', "out of range"),
    ('[[token]]\nprincipal = "a"\nsha256 = "' + "0" * 64 + '"\nrole = "x"\n', "unknown key"),
    ('[[tokens]]\nprincipal = "a"\n', "unknown key"),
])
def test_token_file_errors_name_the_entry(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tokens(text)


ACL = '''
[[allow]]
principals = ["alice"]
permissions = ["publish", "consume"]
topics = ["orders", "orders.*"]
groups = ["billing-*"]

[[allow]]
principals = ["svc-*"]
permissions = ["consume"]
topics = ["*"]

[[allow]]
principals = ["ops"]
permissions = ["admin"]
topics = ["logs.*"]

[[allow]]
principals = ["router"]
permissions = ["mirror"]

[[allow]]
principals = ["root"]
permissions = ["cluster-admin"]
'''


def test_acl_matching(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(ACL)
    acl = Acl(path)
    assert acl.allows("alice", "publish", "orders")
    assert acl.allows("alice", "publish", "orders.eu")
    assert not acl.allows("alice", "publish", "ordersX")  # a prefix needs its separator in the pattern
    assert not acl.allows("alice", "admin", "orders")
    assert acl.allows("alice", "consume", "orders", "billing-1")
    assert not acl.allows("alice", "consume", "orders", "audit")  # group not granted
    assert acl.allows("svc-x", "consume", "anything", "any-group")  # groups default to "*"
    assert not acl.allows("svc-x", "publish", "anything")
    assert acl.allows("ops", "admin", "logs.app") and not acl.allows("ops", "admin", "orders")
    assert acl.allows("router", "mirror") and not acl.allows("router", "cluster-admin")
    assert not acl.allows("alice", "mirror")
    for permission in ("publish", "consume", "admin", "mirror", "cluster-admin"):
        assert acl.allows("root", permission, "x", "g")
    assert not acl.allows("nobody", "consume", "orders")
    assert not acl.allows("alice[", "publish", "orders")  # "[" is literal, never a glob class


@pytest.mark.parametrize(("text", "message"), [
    ('[[allow]]\nprincipals = ["a"]\npermissions = ["write"]\ntopics = ["t"]\n', "unknown permission"),
    ('[[allow]]\nprincipals = ["a"]\npermissions = ["publish"]\n', "topics is required"),
    ('[[allow]]\npermissions = ["mirror"]\n', "principals is required"),
    ('[[allow]]\nprincipals = "a"\npermissions = ["mirror"]\n', "list of non-empty strings"),
    ('[[allow]]\nprincipals = ["a"]\npermissions = ["mirror"]\nhosts = []\n', "unknown key"),
])
def test_acl_errors_name_the_grant(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_acl(text)


def test_every_service_method_is_classified() -> None:
    """A new RPC must be put in the table on purpose (else it silently needs cluster-admin)."""
    services = [broker_pb2.DESCRIPTOR.services_by_name["Broker"], admin_pb2.DESCRIPTOR.services_by_name["Admin"],
                routes_pb2.DESCRIPTOR.services_by_name["Mirror"]]
    methods = [f"/{s.full_name}/{m.name}" for s in services for m in s.methods]
    assert broker_pb2_grpc and admin_pb2_grpc  # the generated modules the table is keyed by
    missing = [m for m in methods if m not in METHOD_RULES]
    assert not missing, f"classify these methods in METHOD_RULES: {missing}"
    assert METHOD_RULES["/broker.v1.Admin/AddNode"] == DEFAULT_RULE


def test_request_resource() -> None:
    assert request_resource(broker_pb2.PublishRequest(topic="t")) == ("t", "")
    publish = broker_pb2.PublishRequest(topic="t2")
    assert request_resource(Received(publish, publish.SerializeToString())) == ("t2", ""), "Publish keeps its bytes"
    assert request_resource(admin_pb2.DropTopicRequest(name="t")) == ("t", "")
    assert request_resource(admin_pb2.CreateTopicRequest(config={"name": "t"})) == ("t", "")
    assert request_resource(broker_pb2.AckRequest(topic="t", group="g")) == ("t", "g")
