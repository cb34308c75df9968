"""The HTTP gateway of a node with mTLS and client-certificate principals (``tls_principal_from_cert``),
as a real node process: the gateway presents its node's certificate to reach the nodes, and that
must not make an HTTP caller without a token the node's principal (docs/security.md: HTTP gets the
same 401/403 as gRPC)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from broker.client import Client, ClientSecurity
from broker.devcluster import DevCluster
from broker.security.devcerts import DevSecurity
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

# every authenticated principal may publish and read "orders": an anonymous HTTP caller must not
ACL = """
[[allow]]
principals = ["admin"]
permissions = ["cluster-admin"]

[[allow]]
principals = ["*"]
permissions = ["publish", "consume"]
topics = ["orders"]
"""


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevCluster, DevSecurity]]:
    data = tmp_path_factory.mktemp("gateway-mtls")
    security = DevSecurity(data)
    cluster = DevCluster(1, data, security=security, http=True,
                         extra_args=["--tls-client-ca-file", str(data / "tls" / "ca.pem"), "--tls-principal-from-cert"])
    security.ensure(cluster.addresses)
    security.acl_file.write_text(ACL)
    cluster.start()
    try:
        cluster.wait_ready(60)
        wait_until(lambda: _answers(f"http://{cluster.http_address(0)}/openapi.json"), 30, "the gateway")
        yield cluster, security
    finally:
        cluster.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_http_caller_without_a_token_is_not_the_nodes_principal(mtls: tuple[DevCluster, DevSecurity]) -> None:
    cluster, security = mtls
    cert, key = security.admin_cert()
    with Client(cluster.addresses, security=ClientSecurity(ca_pem=security.ca_file.read_bytes(),
                                                           cert_pem=cert.read_bytes(), key_pem=key.read_bytes()),
                retry_deadline_s=30) as admin:  # a direct mTLS client: its certificate's principal, "admin"
        admin.create_topic("orders", 1, exist_ok=True)
    base = f"http://{cluster.http_address(0)}/v1"
    anonymous = [httpx.get(f"{base}/topics", timeout=10), httpx.get(f"{base}/cluster", timeout=10),
                 httpx.post(f"{base}/topics/orders/records", json={"records": [{"value": "x"}]}, timeout=10),
                 httpx.get(f"{base}/topics/orders/records", timeout=10)]
    for r in anonymous:
        assert r.status_code == 401, (r.request.url, r.status_code, r.text)
        assert "missing credentials" in r.json()["detail"]
    bearer = {"Authorization": f"Bearer {security.admin_token()}"}
    r = httpx.get(f"{base}/topics/orders/records", headers=bearer, timeout=10)
    assert r.status_code == 200 and r.json()["records"] == [], "nothing was published by the refused requests"
    r = httpx.post(f"{base}/topics/orders/records", json={"records": [{"value": "y"}]}, headers=bearer, timeout=10)
    assert r.status_code == 200, r.text
