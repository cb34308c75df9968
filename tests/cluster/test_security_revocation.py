"""A grant revoked while a Subscribe stream is open (SPEC §8, docs/security.md "ACL"): the stream ends
with PERMISSION_DENIED before it delivers anything published after the revocation, as an open
PublishStream already refuses its next request. A one-node secure cluster of a separate process."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
import pytest

from broker.client import Client
from broker.devcluster import DevCluster
from broker.security.devcerts import DevSecurity
from broker.security.tokens import hash_token_sha256
from broker.v1 import broker_pb2, broker_pb2_grpc
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

TOKEN = "tok-revoked-0123456789"
ACL = """
[[allow]]
principals = ["admin"]
permissions = ["cluster-admin"]

[[allow]]
principals = ["svc"]
permissions = ["publish", "consume"]
topics = ["events"]
"""


@pytest.fixture
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, DevSecurity]]:
    data = tmp_path_factory.mktemp("revocation")
    security = DevSecurity(data)
    cluster = DevCluster(1, data, security=security)
    security.ensure(cluster.addresses)
    security.acl_file.write_text(ACL)
    cluster.start()
    try:
        cluster.wait_ready(60)
        with Client(client_config=security.client_config, retry_deadline_s=30) as admin:
            admin.create_topic("events", 1, exist_ok=True)
        _write_tokens(security)
        yield cluster, security
    finally:
        cluster.stop()


def _write_tokens(security: DevSecurity) -> None:
    lines = (f'[[token]]\nprincipal = "admin"\nsha256 = "{hash_token_sha256(security.admin_token())}"\n'
             f'[[token]]\nprincipal = "svc"\nsha256 = "{hash_token_sha256(TOKEN)}"\n')
    new = security.tokens_file.with_suffix(".new")
    new.write_text(lines)
    new.replace(security.tokens_file)


def _channel(cluster: DevCluster, security: DevSecurity) -> grpc.Channel:
    creds = grpc.composite_channel_credentials(grpc.ssl_channel_credentials(security.ca_file.read_bytes()),
                                               grpc.access_token_call_credentials(TOKEN))
    return grpc.secure_channel(cluster.addresses[0], creds)


def _publish(security: DevSecurity, value: bytes) -> None:
    with Client(client_config=security.client_config, retry_deadline_s=30) as admin:
        admin.publish("events", value)


def test_an_open_subscription_ends_when_its_grant_is_revoked(secured: tuple[DevCluster, DevSecurity]) -> None:
    cluster, security = secured
    seen: queue.Queue[object] = queue.Queue()
    with _channel(cluster, security) as channel:
        stream = broker_pb2_grpc.BrokerStub(channel).Subscribe(broker_pb2.SubscribeRequest(topic="events"),
                                                               timeout=60)

        def read() -> None:
            try:
                for answer in stream:
                    for record in answer.batch.records:
                        seen.put(record.value)
            except grpc.RpcError as exc:
                seen.put(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        _publish(security, b"before")
        assert seen.get(timeout=30) == b"before"
        new = security.acl_file.with_suffix(".new")
        new.write_text(ACL.replace('permissions = ["publish", "consume"]', 'permissions = ["publish"]'))
        new.replace(security.acl_file)  # svc may no longer consume
        _publish(security, b"after")
        ended = seen.get(timeout=30)
        assert isinstance(ended, grpc.RpcError), f"delivered after the grant was revoked: {ended!r}"
        assert ended.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "principal 'svc' lacks the 'consume' permission on topic:events" in (ended.details() or "")
        reader.join(10)
    assert wait_until(lambda: '"principal":"svc","resource":"topic:events","result":"denied: '
                      in cluster.log_path(0).read_text(), 10, "the refusal audited")
