"""``broker.replication.dial.redirect_dials``: pysyncobj dials the mapped proxy instead of the peer
(what ``python -m chaos.node_shim`` installs before running a node behind the drill's proxies)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from pysyncobj import tcp_connection
from pysyncobj.poller import createPoller

from broker.replication.dial import redirect_dials

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
ACCEPT_TIMEOUT_S = 20.0


def listening() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.settimeout(ACCEPT_TIMEOUT_S)
    return sock


@pytest.fixture
def restored_connect() -> Iterator[None]:
    original = tcp_connection.TcpConnection.connect
    yield
    tcp_connection.TcpConnection.connect = original


def dial(host: str, port: int) -> tcp_connection.TcpConnection:
    conn = tcp_connection.TcpConnection(createPoller("select"))
    assert conn.connect(host, port)
    return conn


@pytest.mark.usefixtures("restored_connect")
def test_a_mapped_peer_is_dialled_through_its_proxy_and_others_directly() -> None:
    proxy, peer, other = listening(), listening(), listening()
    with proxy, peer, other:
        peer_address = f"127.0.0.1:{peer.getsockname()[1]}"
        redirect_dials({peer_address: f"127.0.0.1:{proxy.getsockname()[1]}"})
        mapped = dial("127.0.0.1", peer.getsockname()[1])
        accepted, _ = proxy.accept()  # the proxy gets the connection meant for the peer
        accepted.close()
        peer.settimeout(0.5)
        with pytest.raises(TimeoutError):
            peer.accept()
        direct = dial("127.0.0.1", other.getsockname()[1])
        accepted, _ = other.accept()  # an unmapped address is dialled as it is
        accepted.close()
        mapped.disconnect()
        direct.disconnect()
