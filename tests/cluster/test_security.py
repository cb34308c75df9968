"""SPEC §8 security against a real ``raftbroker dev --nodes 3 --secure`` cluster (separate processes):
authentication (no, wrong, expired token), ACLs for publish/consume/admin/cluster-admin/mirror,
TLS trust, plaintext against the TLS port, the producer stamped and unforgeable, token rotation
under a connected client, the audit log, and the CLI and SDK with the printed client config."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from broker.client import Client, ClientSecurity, PermissionDenied, Record, Unauthenticated, Unavailable
from broker.client.aio import AsyncClient
from broker.devcluster import DevCluster
from broker.security.devcerts import issue_cert, make_ca
from broker.security.tokens import hash_token_sha256
from broker.v1 import broker_pb2, broker_pb2_grpc, internal_pb2, routes_pb2, routes_pb2_grpc
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

TOKENS = {"alice": "tok-alice-0123456789", "bob": "tok-bob-0123456789", "mallory": "tok-mallory-0123456789",
          "carol": "tok-carol-0123456789"}
ACL = """
[[allow]]
principals = ["admin"]
permissions = ["cluster-admin"]

[[allow]]
principals = ["alice"]
permissions = ["publish", "consume"]
topics = ["orders", "orders.*"]
groups = ["billing-*"]

[[allow]]
principals = ["bob"]
permissions = ["consume"]
topics = ["orders"]
"""


@dataclass
class SecureCluster:
    data_dir: Path
    client_config: Path
    addresses: list[str]
    pids: list[int]
    proc: subprocess.Popen[str]
    http: list[str]  # each node's HTTP gateway (dev starts one beside every node)

    @property
    def tls(self) -> Path:
        return self.data_dir / "tls"

    def security(self, token: str | None = None, token_file: Path | None = None) -> ClientSecurity:
        return ClientSecurity(ca_pem=(self.tls / "ca.pem").read_bytes(), token=token, token_file=token_file)

    def client(self, token: str | None = None, retry_deadline_s: float = 30.0, **kw: object) -> Client:
        return Client(self.addresses, security=self.security(token, **kw),  # type: ignore[arg-type]
                      retry_deadline_s=retry_deadline_s)

    def write_tokens(self, tokens: dict[str, str], expired: tuple[str, ...] = ()) -> None:
        """The admin token plus ``tokens`` (principal → token); ``expired`` ones expired in 2020."""
        admin = (self.tls / "admin.token").read_text().strip()
        lines = [f'[[token]]\nprincipal = "admin"\nsha256 = "{hash_token_sha256(admin)}"\n']
        for principal, token in tokens.items():
            lines.append(f'[[token]]\nprincipal = "{principal}"\nsha256 = "{hash_token_sha256(token)}"\n'
                         + ("expires_at = 2020-01-01T00:00:00Z\n" if principal in expired else ""))
        tmp = self.tls / "tokens.toml.new"
        tmp.write_text("\n".join(lines))
        tmp.replace(self.tls / "tokens.toml")

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.data_dir.glob("n*.log")))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    data = tmp_path_factory.mktemp("secure")
    from broker.devcluster import free_base_port

    cmd = [sys.executable, "-m", "broker.cli.main", "dev", "--nodes", "3", "--secure", "--data-dir", str(data),
           "--base-port", str(free_base_port(3))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    pids: list[int] = []
    http: list[str] = []
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        config = None
        for line in proc.stdout:  # ends when dev exits; pytest-timeout bounds a hang
            lines.append(line)
            pids += [int(p) for p in re.findall(r"\bpid (\d+)", line)]
            http += re.findall(r"\bhttp (http://\S+)", line)
            if line.startswith("client config: "):
                config = Path(line.removeprefix("client config: ").strip())
                break
        assert config is not None, "no 'client config:' line:\n" + "".join(lines)
        assert lines[0].startswith("cluster ready: "), lines
        addresses = lines[0].removeprefix("cluster ready: ").strip().split(",")
        cluster = SecureCluster(data, config, addresses, pids, proc, http)
        cluster.write_tokens({k: v for k, v in TOKENS.items()}, expired=("carol",))
        (cluster.tls / "acl.toml").write_text(ACL)
        yield cluster
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pid in pids:  # nodes run in sessions of their own: make sure none outlives the test
            if _pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def admin_client(c: SecureCluster) -> Client:
    return Client(client_config=c.client_config, retry_deadline_s=30)


@pytest.fixture(scope="module")
def orders(secure: SecureCluster) -> str:
    with admin_client(secure) as admin:
        admin.create_topic("orders", 2, exist_ok=True)
    return "orders"


def test_no_token_is_unauthenticated(secure: SecureCluster, orders: str) -> None:
    with secure.client(None) as client, pytest.raises(Unauthenticated, match="missing credentials"):
        client.publish(orders, b"x")


def test_wrong_token_is_unauthenticated(secure: SecureCluster, orders: str) -> None:
    with secure.client("not-a-token") as client, pytest.raises(Unauthenticated, match="unknown bearer token"):
        client.list_topics()


def test_expired_token_is_unauthenticated(secure: SecureCluster, orders: str) -> None:
    with secure.client(TOKENS["carol"]) as client, pytest.raises(Unauthenticated, match="'carol' has expired"):
        client.publish(orders, b"x")


def test_publish_without_the_acl_is_denied_and_changes_nothing(secure: SecureCluster, orders: str) -> None:
    with secure.client(TOKENS["bob"]) as bob, admin_client(secure) as admin:
        before = sum(1 for r in admin.subscribe(orders, stop_at_end=True) if isinstance(r, Record))
        with pytest.raises(PermissionDenied, match="'bob' lacks the 'publish' permission on topic:orders"):
            bob.publish(orders, b"x")
        after = sum(1 for r in admin.subscribe(orders, stop_at_end=True) if isinstance(r, Record))
        assert after == before


def test_consume_without_the_acl_is_denied(secure: SecureCluster, orders: str) -> None:
    with secure.client(TOKENS["mallory"]) as mallory, \
            pytest.raises(PermissionDenied, match="'mallory' lacks the 'consume' permission on topic:orders"):
        list(mallory.subscribe(orders, stop_at_end=True))


def test_group_consume_needs_the_group_grant(secure: SecureCluster, orders: str) -> None:
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials((secure.tls / "ca.pem").read_bytes()),
        grpc.access_token_call_credentials(TOKENS["alice"]))
    with grpc.secure_channel(secure.addresses[0], creds) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.JoinGroup(broker_pb2.JoinGroupRequest(topic=orders, group="audit"), timeout=10)
        assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'consume' permission on group:orders/audit" in (raised.value.details() or "")


def test_admin_without_the_acl_is_denied(secure: SecureCluster) -> None:
    with secure.client(TOKENS["alice"]) as alice:
        with pytest.raises(PermissionDenied, match="'alice' lacks the 'admin' permission on topic:orders.new"):
            alice.create_topic("orders.new", 1)
        with pytest.raises(PermissionDenied, match="'cluster-admin' permission on cluster"):
            alice.add_node("n9", "127.0.0.1:1", "127.0.0.1:2")
        with pytest.raises(PermissionDenied, match="'cluster-admin'"):
            alice.create_route("r1", "orders", "orders.copy", target_cluster=["127.0.0.1:1"])
    with admin_client(secure) as admin:
        assert "orders.new" not in {t.name for t in admin.list_topics()}
        assert [r for r in admin.list_routes()] == []


def test_untrusted_ca_is_refused_at_once_saying_so(secure: SecureCluster, orders: str) -> None:
    """A CA that signed none of the nodes' certificates, or a ``server_name`` none of them carries:
    refused, and said so once every node has answered that way (a minute's retry deadline, so
    waiting it out would say "no leader answered")."""
    other_ca, _ = make_ca("some other CA")
    token = (secure.tls / "admin.token").read_text().strip()
    security = ClientSecurity(ca_pem=other_ca, token=token)
    with Client(secure.addresses, security=security, retry_deadline_s=60) as client, \
            pytest.raises(Unavailable, match="does not trust the nodes' certificates"):
        client.list_topics()
    security = ClientSecurity(ca_pem=(secure.tls / "ca.pem").read_bytes(), token=token, server_name="elsewhere")
    with Client(secure.addresses, security=security, retry_deadline_s=60) as client, \
            pytest.raises(Unavailable, match="do not carry the name this client checks"):
        client.list_topics()


def test_plaintext_against_the_tls_port_is_refused_at_once_saying_so(secure: SecureCluster) -> None:
    """A client without the cluster's TLS settings is told what is wrong, not left to retry as if
    every node were down: each node is asked once whether it answers TLS. The retry deadline is a
    minute, so an answer that came from waiting it out would say "no leader answered"."""
    with Client(secure.addresses, retry_deadline_s=60) as client, pytest.raises(Unavailable) as raised:
        client.list_topics()
    assert "expect TLS" in raised.value.message and "--client-config" in raised.value.message, raised.value
    assert all(a in raised.value.message for a in secure.addresses)

    with Client(secure.addresses, retry_deadline_s=60) as client, pytest.raises(Unavailable, match="expect TLS"):
        next(iter(client.subscribe("orders", start="earliest")))  # a stream's own retries
    with Client(secure.addresses, retry_deadline_s=60) as client, pytest.raises(Unavailable, match="expect TLS"), \
            client.subscribe("orders", group="billing-x") as consumer:
        next(iter(consumer))

    async def aio() -> None:
        async with AsyncClient(secure.addresses, retry_deadline_s=60) as c:
            await c.list_topics()

    async def aio_stream() -> None:  # the unary call that opens a batch subscription says so
        async with AsyncClient(secure.addresses, retry_deadline_s=60) as c, \
                c.subscribe_batches("orders", start="earliest") as sub:
            async for _ in sub:
                break

    async def aio_group() -> None:  # a queue group's stream opens without a unary call first
        async with AsyncClient(secure.addresses, retry_deadline_s=60) as c, c.consumer("orders", "billing-x") as sub:
            async for _ in sub:
                break

    for main in (aio, aio_stream, aio_group):
        with pytest.raises(Unavailable, match="expect TLS"):
            asyncio.run(main())


def test_tls_against_a_plaintext_cluster_is_refused_at_once_saying_so(secure: SecureCluster,
                                                                       cluster: DevCluster) -> None:
    """The other way round: a client with a client config against a cluster that serves plaintext."""
    cluster.wait_ready()
    with Client(cluster.addresses, security=secure.security(), retry_deadline_s=60) as client, \
            pytest.raises(Unavailable, match="answer without it") as raised:
        client.list_topics()
    assert all(a in raised.value.message for a in cluster.addresses)


def _forged_record(value: bytes) -> broker_pb2.PublishRecord:
    """A PublishRecord carrying body fields a client may not set, as unknown fields on the wire."""
    forged = internal_pb2.RecordBody(producer="billing-service", origin="west-1/n1", msg_id="999")
    record = broker_pb2.PublishRecord()
    record.ParseFromString(broker_pb2.PublishRecord(value=value).SerializeToString() + forged.SerializeToString())
    return record


def test_forged_producer_is_overwritten_by_the_principal(secure: SecureCluster, orders: str) -> None:
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials((secure.tls / "ca.pem").read_bytes()),
        grpc.access_token_call_credentials(TOKENS["alice"]))
    with secure.client(TOKENS["alice"]) as alice:
        leader = alice.cluster_status().leader_id
        address = next(n.grpc_address for n in alice.cluster_status().nodes if n.id == leader)
        with grpc.secure_channel(address, creds) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            stub.Publish(broker_pb2.PublishRequest(topic=orders, records=[_forged_record(b"forged-unary")]),
                         timeout=10)
            list(stub.PublishStream(iter([broker_pb2.PublishRequest(
                topic=orders, records=[_forged_record(b"forged-stream")])]), timeout=10))
        alice.publish(orders, b"sdk")
        records = {r.value: r for r in alice.subscribe(orders, stop_at_end=True) if isinstance(r, Record)}
    for value in (b"forged-unary", b"forged-stream", b"sdk"):
        assert records[value].producer == "alice", records[value]
        assert records[value].origin != "west-1/n1" and records[value].msg_id != "999"


def test_publish_stream_to_a_topic_without_the_acl_is_denied(secure: SecureCluster, orders: str) -> None:
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials((secure.tls / "ca.pem").read_bytes()),
        grpc.access_token_call_credentials(TOKENS["alice"]))
    with admin_client(secure) as admin:
        admin.create_topic("payroll", 1, exist_ok=True)
        leader = admin.cluster_status().leader_id
        address = next(n.grpc_address for n in admin.cluster_status().nodes if n.id == leader)
    with grpc.secure_channel(address, creds) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        requests = [broker_pb2.PublishRequest(topic=orders, records=[broker_pb2.PublishRecord(value=b"ok")]),
                    broker_pb2.PublishRequest(topic="payroll", records=[broker_pb2.PublishRecord(value=b"no")])]
        answers = []
        with pytest.raises(grpc.RpcError) as raised:
            for answer in stub.PublishStream(iter(requests), timeout=10):
                answers.append(answer)
        assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'publish' permission on topic:payroll" in (raised.value.details() or "")
        assert len(answers) == 1  # the allowed request before it was answered
    with admin_client(secure) as admin:
        assert [r for r in admin.subscribe("payroll", stop_at_end=True) if isinstance(r, Record)] == []


def test_mirror_append_needs_the_mirror_right(secure: SecureCluster, orders: str) -> None:
    body = internal_pb2.RecordBody(value=b"mirrored", producer="billing-service", origin="west-1/n1",
                                   headers={"auth": "verified"}).SerializeToString()
    request = routes_pb2.MirrorAppendRequest(topic=orders, records=[routes_pb2.MirrorRecord(
        body=body, source_partition=0, idempotency_key="mirror-test-1")])
    ca = grpc.ssl_channel_credentials((secure.tls / "ca.pem").read_bytes())
    with admin_client(secure) as admin:
        leader = admin.cluster_status().leader_id
        address = next(n.grpc_address for n in admin.cluster_status().nodes if n.id == leader)
    alice = grpc.composite_channel_credentials(ca, grpc.access_token_call_credentials(TOKENS["alice"]))
    with grpc.secure_channel(address, alice) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            routes_pb2_grpc.MirrorStub(channel).Append(request, timeout=10)
        assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'alice' lacks the 'mirror' permission" in (raised.value.details() or "")
    with admin_client(secure) as admin:
        assert not [r for r in admin.subscribe(orders, stop_at_end=True)
                    if isinstance(r, Record) and r.value == b"mirrored"]
    admin_token = (secure.tls / "admin.token").read_text().strip()
    root = grpc.composite_channel_credentials(ca, grpc.access_token_call_credentials(admin_token))
    with grpc.secure_channel(address, root) as channel:
        routes_pb2_grpc.MirrorStub(channel).Append(request, timeout=10)  # cluster-admin may mirror


def test_token_rotation_while_a_client_is_connected(secure: SecureCluster, orders: str, tmp_path: Path) -> None:
    token_file = tmp_path / "svc.token"
    token_file.write_text("rot-old-0123456789\n")
    secure.write_tokens({**TOKENS, "alice": TOKENS["alice"], "svc-rot": "rot-old-0123456789"}, expired=("carol",))
    acl = (secure.tls / "acl.toml").read_text()
    (secure.tls / "acl.toml").write_text(
        acl + '\n[[allow]]\nprincipals = ["svc-rot"]\npermissions = ["publish", "consume"]\ntopics = ["orders"]\n')
    with secure.client(token_file=token_file) as rotating, secure.client("rot-old-0123456789") as stale:
        wait_until(lambda: rotating.publish(orders, b"before rotation"), 30, "the new principal to be accepted")
        # rotate: the server accepts both, the client's token file gets the new one, the old is removed
        secure.write_tokens({**TOKENS, "svc-rot": "rot-new-0123456789", "svc-rot-old": "rot-old-0123456789"},
                            expired=("carol",))
        token_file.write_text("rot-new-0123456789\n")
        rotating.publish(orders, b"during rotation")
        secure.write_tokens({**TOKENS, "svc-rot": "rot-new-0123456789"}, expired=("carol",))
        rotating.publish(orders, b"after rotation")  # same client, same channels, no restart anywhere
        with pytest.raises(Unauthenticated, match="unknown bearer token"):
            stale.publish(orders, b"old token")
        records = [r for r in rotating.subscribe(orders, stop_at_end=True) if isinstance(r, Record)]
    by_value = {r.value: r.producer for r in records}
    assert by_value[b"before rotation"] == "svc-rot" and by_value[b"after rotation"] == "svc-rot"
    assert by_value[b"during rotation"] in ("svc-rot", "svc-rot-old")
    assert b"old token" not in by_value


def test_redirect_to_the_leader_over_tls(secure: SecureCluster, orders: str) -> None:
    with admin_client(secure) as admin:
        status = admin.cluster_status()
        follower = next(n.grpc_address for n in status.nodes if n.id != status.leader_id)
    with Client([follower], client_config=secure.client_config) as client:
        result = client.publish(orders, b"via a follower")
        assert client.leader is not None and client.leader != follower
        assert result.offset >= 0


def test_audit_log_has_admin_actions_and_refusals(secure: SecureCluster, orders: str) -> None:
    with secure.client(TOKENS["mallory"]) as mallory, pytest.raises(PermissionDenied):
        mallory.drop_topic(orders)
    with secure.client(None) as anonymous:
        with pytest.raises(Unauthenticated):
            anonymous.publish_batch(orders, [b"x"])  # a unary Publish
        with pytest.raises(Unauthenticated):
            anonymous.publish(orders, b"x")  # on a PublishStream: refused before its first request is read
    with admin_client(secure) as admin:
        admin.create_topic("audited", 1, exist_ok=True)

    def entries() -> list[dict[str, object]]:
        return [json.loads(line.split("raftbroker.audit: ", 1)[1]) for line in secure.logs().splitlines()
                if "raftbroker.audit: " in line]

    def has(principal: str, action: str, resource: str, result: str) -> bool:
        return any(e["principal"] == principal and e["action"] == action and e["resource"] == resource
                   and str(e["result"]).startswith(result) for e in entries())

    wait_until(lambda: has("mallory", "/broker.v1.Admin/DropTopic", "topic:orders", "denied: principal 'mallory'"),
               30, "the refused drop in the audit log")
    wait_until(lambda: has("admin", "/broker.v1.Admin/CreateTopic", "topic:audited", "ok"), 30,
               "the admin action in the audit log")
    wait_until(lambda: has("", "/broker.v1.Broker/Publish", "topic:orders", "unauthenticated"), 30,
               "the unauthenticated publish in the audit log")
    wait_until(lambda: has("", "/broker.v1.Broker/PublishStream", "cluster", "unauthenticated"), 30,
               "the unauthenticated publish stream in the audit log")


def test_cli_and_sdk_with_the_printed_client_config(secure: SecureCluster) -> None:
    cli = [sys.executable, "-m", "broker.cli.main"]
    env = {k: v for k, v in os.environ.items() if k not in ("RAFTBROKER_BOOTSTRAP", "RAFTBROKER_CLIENT_CONFIG")}

    def run(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120,
                              env={**env, **(extra_env or {})})

    created = run("--client-config", str(secure.client_config), "topic", "create", "cli.topic")
    assert created.returncode == 0, created.stderr
    published = run("publish", "cli.topic", "hello over tls",
                    extra_env={"RAFTBROKER_CLIENT_CONFIG": str(secure.client_config)})
    assert published.returncode == 0, published.stderr
    consumed = run("--client-config", str(secure.client_config), "--json", "consume", "cli.topic")
    assert consumed.returncode == 0, consumed.stderr
    rows = [json.loads(line) for line in consumed.stdout.splitlines() if line.strip()]
    assert [r.get("value") for r in rows] == ["hello over tls"], rows
    refused = run("-b", secure.addresses[0], "--retry-deadline", "2", "topic", "list")  # no config: plaintext
    assert refused.returncode == 1 and "raftbroker: error:" in refused.stderr
    os.environ["RAFTBROKER_CLIENT_CONFIG"] = str(secure.client_config)
    try:
        with Client() as client:  # the SDK reads the same file from the environment
            assert "cli.topic" in {t.name for t in client.list_topics()}
    finally:
        del os.environ["RAFTBROKER_CLIENT_CONFIG"]


def _served_common_name(address: str) -> str:
    host, _, port = address.rpartition(":")
    pem = ssl.get_server_certificate((host, int(port)), timeout=5)
    cert = x509.load_pem_x509_certificate(pem.encode())
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_certificate_is_reloaded_without_restart(secure: SecureCluster, orders: str) -> None:
    address = secure.addresses[0]
    assert _served_common_name(address) == "n1"
    cert, key = issue_cert((secure.tls / "ca.pem").read_bytes(), (secure.tls / "ca-key.pem").read_bytes(),
                           "n1-renewed", ["localhost", "n1"], ["127.0.0.1"])
    for name, data in (("n1-key.pem", key), ("n1.pem", cert)):
        (secure.tls / f"{name}.new").write_bytes(data)
        (secure.tls / f"{name}.new").replace(secure.tls / name)
    wait_until(lambda: _served_common_name(address) == "n1-renewed", 30, "the renewed certificate to be served")
    with Client([address], client_config=secure.client_config) as client:  # a new connection trusts it
        assert orders in {t.name for t in client.list_topics()}


def test_health_is_public_and_reflection_needs_a_token(secure: SecureCluster) -> None:
    ca = grpc.ssl_channel_credentials((secure.tls / "ca.pem").read_bytes())
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    with grpc.secure_channel(secure.addresses[0], ca) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as raised:
            list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([request]), timeout=10))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    token = (secure.tls / "admin.token").read_text().strip()
    with grpc.secure_channel(secure.addresses[0], grpc.composite_channel_credentials(
            ca, grpc.access_token_call_credentials(token))) as channel:
        answers = list(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([request]), timeout=10))
        assert "broker.v1.Broker" in {s.name for s in answers[0].list_services_response.service}


def test_route_to_the_secure_cluster_uses_the_route_client_config(secure: SecureCluster, tmp_path: Path) -> None:
    """A plaintext one-node source cluster mirrors into the secured cluster with its client config
    (TLS and the admin token, which may mirror); without one the route cannot deliver."""
    with admin_client(secure) as admin:
        admin.create_topic("mirror.target", 1, exist_ok=True)
    source = DevCluster(1, tmp_path / "source", extra_args=["--cluster-id", "source", "--route-client-config",
                                                                 str(secure.client_config)])
    plain = DevCluster(1, tmp_path / "plain", extra_args=["--cluster-id", "plain"])
    try:
        source.start()
        plain.start()
        source.wait_ready(60)
        plain.wait_ready(60)
        with Client(source.addresses, retry_deadline_s=30) as src, Client(plain.addresses) as other, \
                admin_client(secure) as admin:
            for client in (src, other):
                client.create_topic("local", 1)
                client.create_route("out", "local", "mirror.target", target_cluster=secure.addresses)
            src.publish("local", b"routed over tls")
            other.publish("local", b"routed in plaintext")

            def arrived() -> bool:
                return any(r.value == b"routed over tls" for r in admin.subscribe("mirror.target", stop_at_end=True)
                           if isinstance(r, Record))

            try:
                wait_until(arrived, 90, "the routed copy on the secure cluster")
            except AssertionError:
                raise AssertionError(f"route: {src.route('out')}") from None
            assert other.route("out").lag > 0  # the plaintext router cannot reach the TLS port
            assert not [r for r in admin.subscribe("mirror.target", stop_at_end=True)
                        if isinstance(r, Record) and r.value == b"routed in plaintext"]
    finally:
        source.stop()
        plain.stop()


def test_the_http_gateway_reaches_the_tls_cluster_and_checks_the_callers_token(secure: SecureCluster,
                                                                               orders: str) -> None:
    """The gateway beside each TLS node speaks TLS to the nodes and passes the caller's bearer token,
    so HTTP gets the same authentication and ACLs as gRPC (401, 403 naming the permission, then 200)."""
    assert len(secure.http) == 3, "dev --secure prints each node's HTTP gateway"

    def bearer(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    with httpx.Client(base_url=secure.http[1], timeout=30) as h:
        missing = h.get("/v1/topics")
        assert missing.status_code == 401 and missing.headers["content-type"].startswith("application/problem+json")
        assert h.get("/v1/topics", headers=bearer("not-a-token")).status_code == 401
        denied = h.post(f"/v1/topics/{orders}/records", json={"records": [{"value": "from-bob"}]},
                        headers=bearer(TOKENS["bob"]))
        assert denied.status_code == 403 and "publish" in denied.json()["detail"], denied.text
        placed = h.post(f"/v1/topics/{orders}/records", json={"records": [{"value": "via-http", "key": "k"}]},
                        headers=bearer(TOKENS["alice"]))
        assert placed.status_code == 200, placed.text
        result = placed.json()["results"][0]
        page = h.get(f"/v1/topics/{orders}/records", params={"partition": result["partition"],
                                                             "from": result["offset"], "limit": 1},
                     headers=bearer(TOKENS["bob"]))
        assert page.status_code == 200, page.text
        assert [r["value"] for r in page.json()["records"]] == ["via-http"]
    with secure.client(TOKENS["bob"]) as client:  # stored with the caller's principal as producer
        [record] = client.read_range(orders, result["partition"], result["offset"], result["offset"] + 1)
        assert isinstance(record, Record) and record.producer == "alice"
