"""mTLS (SPEC §8): a node with ``--tls-client-ca-file`` refuses clients without a certificate its CA
signed, and with ``--tls-principal-from-cert`` a call without a token is its certificate's common
name (stamped as the producer). A one-node cluster of a separate process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client, ClientSecurity, PermissionDenied, Record, Unavailable
from broker.devcluster import DevCluster
from broker.security.devcerts import DevSecurity, issue_cert, make_ca

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, DevSecurity]]:
    data = tmp_path_factory.mktemp("mtls")
    security = DevSecurity(data)
    cluster = DevCluster(1, data, security=security, extra_args=[
        "--tls-client-ca-file", str(data / "tls" / "ca.pem"), "--tls-principal-from-cert"])
    cluster.start()
    try:
        cluster.wait_ready(60)
        (data / "tls" / "acl.toml").write_text(
            '[[allow]]\nprincipals = ["admin"]\npermissions = ["cluster-admin"]\n'
            '[[allow]]\nprincipals = ["svc-cert"]\npermissions = ["publish", "consume"]\ntopics = ["t"]\n')
        yield cluster, security
    finally:
        cluster.stop()


def _client_cert(security: DevSecurity, name: str, ca: tuple[bytes, bytes] | None = None) -> tuple[bytes, bytes]:
    ca_cert, ca_key = ca or (security.ca_file.read_bytes(), (security.tls_dir / "ca-key.pem").read_bytes())
    return issue_cert(ca_cert, ca_key, name, [], [])


def test_client_certificate_is_required_and_names_the_principal(mtls: tuple[DevCluster, DevSecurity],
                                                                tmp_path: Path) -> None:
    cluster, security = mtls
    ca = security.ca_file.read_bytes()
    cert, key = _client_cert(security, "svc-cert")
    with Client(cluster.addresses, security=ClientSecurity(ca_pem=ca, token=security.admin_token(), cert_pem=cert,
                                                           key_pem=key), retry_deadline_s=60) as admin:
        admin.create_topic("t", 1, exist_ok=True)
    with Client(cluster.addresses, security=ClientSecurity(ca_pem=ca, cert_pem=cert, key_pem=key)) as svc:
        svc.publish("t", b"by certificate")
        records = [r for r in svc.subscribe("t", stop_at_end=True) if isinstance(r, Record)]
        assert [(r.value, r.producer) for r in records] == [(b"by certificate", "svc-cert")]
        with pytest.raises(PermissionDenied, match="'svc-cert' lacks the 'admin' permission"):
            svc.create_topic("t2", 1)
    with Client(cluster.addresses, security=ClientSecurity(ca_pem=ca, token=security.admin_token()),
                retry_deadline_s=2) as no_cert, pytest.raises(Unavailable):
        no_cert.list_topics()
    other_cert, other_key = _client_cert(security, "svc-cert", ca=make_ca("another CA"))
    with Client(cluster.addresses, security=ClientSecurity(ca_pem=ca, cert_pem=other_cert, key_pem=other_key),
                retry_deadline_s=2) as untrusted, pytest.raises(Unavailable):
        untrusted.list_topics()
