"""A grant revoked while a Subscribe stream is open (SPEC §8, docs/security.md "ACL"): the stream ends
with PERMISSION_DENIED before it delivers anything published after the revocation, as an open
PublishStream already refuses its next request. A token removed while streams are open ends them
with UNAUTHENTICATED (reason STREAM_REAUTHENTICATE): the SDK opens them again with the token it holds
now, so a rotated token goes on and a revoked one is refused. A one-node secure cluster of a
separate process."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from broker.client import Client, ClientSecurity, Message, Record, Unauthenticated
from broker.client.aio import AsyncClient
from broker.client.errors import error_info
from broker.devcluster import DevCluster
from broker.reasons import Reason
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


def _write_tokens(security: DevSecurity, *svc_tokens: str) -> None:
    """The admin's token and ``svc_tokens`` (default: :data:`TOKEN`) as principal svc's."""
    lines = f'[[token]]\nprincipal = "admin"\nsha256 = "{hash_token_sha256(security.admin_token())}"\n'
    for token in svc_tokens if svc_tokens else (TOKEN,):
        lines += f'[[token]]\nprincipal = "svc"\nsha256 = "{hash_token_sha256(token)}"\n'
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


def _read_raw(channel: grpc.Channel, seen: queue.Queue[object]) -> threading.Thread:
    """A thread reading a raw Subscribe of "events" as svc: each record's value into ``seen``, then
    the error that ends the stream."""
    stream = broker_pb2_grpc.BrokerStub(channel).Subscribe(broker_pb2.SubscribeRequest(topic="events"), timeout=60)

    def read() -> None:
        try:
            for answer in stream:
                for record in answer.batch.records:
                    seen.put(record.value)
        except grpc.RpcError as exc:
            seen.put(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


def _revoke_grant(security: DevSecurity) -> None:
    new = security.acl_file.with_suffix(".new")
    new.write_text(ACL.replace('permissions = ["publish", "consume"]', 'permissions = ["publish"]'))
    new.replace(security.acl_file)  # svc may no longer consume


def _remove_token(security: DevSecurity) -> None:
    _write_tokens(security, "tok-someone-else-0123456789")  # svc's token is gone


@pytest.mark.parametrize(("cut_off", "code", "message", "reason", "audited"), [
    (_revoke_grant, grpc.StatusCode.PERMISSION_DENIED, "principal 'svc' lacks the 'consume' permission on topic:events",
     None, "denied: "),
    # before: a stream's token was checked as it opened only, so a leaked token removed from the tokens
    # file kept reading through a stream opened before, for as long as that stream lasted
    (_remove_token, grpc.StatusCode.UNAUTHENTICATED,
     "this stream's credentials no longer authenticate principal 'svc' (unknown bearer token)",
     Reason.STREAM_REAUTHENTICATE, "unauthenticated: "),
], ids=["grant-revoked", "token-removed"])
def test_an_open_subscription_ends_when_its_grant_or_token_goes(
        secured: tuple[DevCluster, DevSecurity], cut_off: Callable[[DevSecurity], None], code: grpc.StatusCode,
        message: str, reason: Reason | None, audited: str) -> None:
    cluster, security = secured
    seen: queue.Queue[object] = queue.Queue()
    with _channel(cluster, security) as channel:
        reader = _read_raw(channel, seen)
        _publish(security, b"before")
        assert seen.get(timeout=30) == b"before"
        cut_off(security)
        _publish(security, b"after")
        ended = seen.get(timeout=30)
        assert isinstance(ended, grpc.RpcError), f"delivered after it was cut off: {ended!r}"
        assert ended.code() == code
        assert message in (ended.details() or "")
        info = error_info(ended)
        assert (info.reason if info is not None else None) == reason
        reader.join(10)
    assert wait_until(lambda: f'"principal":"svc","resource":"topic:events","result":"{audited}'
                      in cluster.log_path(0).read_text(), 10, "the refusal audited")


def test_a_rotated_token_keeps_sdk_streams_going_and_a_revoked_one_ends_them(
        secured: tuple[DevCluster, DevSecurity], tmp_path: Path) -> None:
    """The documented rotation (docs/security.md): the new token is added, the client's token_file
    rewritten, the old token removed. The open subscription, group consumer and publish stream are
    ended by the node and opened again with the new token, missing nothing; once that token is
    removed too, each is refused."""
    cluster, security = secured
    token_file = tmp_path / "svc.token"
    token_file.write_text(TOKEN + "\n")
    creds = ClientSecurity(ca_pem=security.ca_file.read_bytes(), token_file=token_file)
    got: queue.Queue[tuple[str, object]] = queue.Queue()
    with Client(cluster.addresses, security=creds, retry_deadline_s=30) as svc:
        subscription = svc.subscribe("events")  # a fresh cluster: the topic is empty
        consumer = svc.subscribe("events", group="svc-g")

        def read(items: Iterator[object], name: str) -> None:
            try:
                for item in items:
                    if isinstance(item, Message):
                        item.ack()  # before the test goes on: an ack in flight during the rotation is its own case
                    if isinstance(item, (Record, Message)):
                        got.put((name, item.value))
            except Exception as exc:  # noqa: BLE001 - reported to the test
                got.put((name, exc))

        readers = [threading.Thread(target=read, args=(subscription, "sub"), daemon=True),
                   threading.Thread(target=read, args=(consumer, "group"), daemon=True)]
        for reader in readers:
            reader.start()
        svc.publish("events", b"one")
        assert sorted(str(got.get(timeout=30)) for _ in range(2)) == ["('group', b'one')", "('sub', b'one')"]
        # rotate
        _write_tokens(security, TOKEN, "tok-rotated-0123456789")
        token_file.write_text("tok-rotated-0123456789\n")
        _write_tokens(security, "tok-rotated-0123456789")
        svc.publish("events", b"two")  # the open publish stream is ended and opened again
        assert sorted(str(got.get(timeout=30)) for _ in range(2)) == ["('group', b'two')", "('sub', b'two')"]
        # revoke
        _write_tokens(security, "tok-someone-else-0123456789")
        with pytest.raises(Unauthenticated):
            svc.publish("events", b"three")
        _publish(security, b"four")  # the admin's
        ended = sorted((name, type(item).__name__) for name, item in (got.get(timeout=30) for _ in range(2)))
        assert ended == [("group", "Unauthenticated"), ("sub", "Unauthenticated")], ended
        subscription.close()
        consumer.close()
        for reader in readers:
            reader.join(10)


def test_the_asyncio_sdk_reopens_a_stream_after_a_rotation_and_ends_it_after_a_revocation(
        secured: tuple[DevCluster, DevSecurity], tmp_path: Path) -> None:
    cluster, security = secured
    token_file = tmp_path / "svc.token"
    token_file.write_text(TOKEN + "\n")
    creds = ClientSecurity(ca_pem=security.ca_file.read_bytes(), token_file=token_file)

    async def run() -> list[object]:
        seen: list[object] = []
        async with AsyncClient(cluster.addresses, security=creds, retry_deadline_s=30) as svc:
            subscription = svc.subscribe("events")
            await svc.publish("events", b"one")
            try:
                async for item in subscription:
                    if not isinstance(item, Record):
                        continue
                    seen.append(item.value)
                    if item.value == b"one":  # rotate
                        _write_tokens(security, TOKEN, "tok-rotated-0123456789")
                        token_file.write_text("tok-rotated-0123456789\n")
                        _write_tokens(security, "tok-rotated-0123456789")
                        await svc.publish("events", b"two")
                    elif item.value == b"two":  # revoke
                        _write_tokens(security, "tok-someone-else-0123456789")
                        _publish(security, b"three")
            except Unauthenticated as exc:
                seen.append(exc)
        return seen

    seen = asyncio.run(asyncio.wait_for(run(), 60))
    assert seen[:2] == [b"one", b"two"] and isinstance(seen[2], Unauthenticated) and len(seen) == 3, seen
