"""DevCluster's ports stay out of the kernel's ephemeral range (where outgoing connections take theirs)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from broker import devcluster
from broker.devcluster import HTTP_PORT_OFFSET, NODES_ADDED_MAX, ephemeral_port_low, free_base_port

pytestmark = pytest.mark.unit


def test_every_port_of_a_cluster_and_of_its_added_nodes_is_below_the_ephemeral_range() -> None:
    low = ephemeral_port_low()
    assert low > 1024
    for nodes in (1, 3, 5):
        for _ in range(50):
            base = free_base_port(nodes)
            assert base + HTTP_PORT_OFFSET + nodes + NODES_ADDED_MAX <= low, (base, low)


def test_an_unreadable_range_falls_back_to_linux_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(devcluster, "_EPHEMERAL_RANGE_FILE", tmp_path / "missing")
    assert ephemeral_port_low() == 32768


def test_a_port_left_in_time_wait_is_free_and_a_listening_port_is_not() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the nodes' servers bind
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    assert not devcluster._port_free(port)
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server side closes first: its end of the connection stays behind (TIME_WAIT)
    client.close()
    listener.close()
    naive = socket.socket()
    with pytest.raises(OSError):  # what the probe did before: the leftover connection blocks a plain bind
        naive.bind(("127.0.0.1", port))
    naive.close()
    assert devcluster._port_free(port)
    again = socket.socket()  # and a server that sets SO_REUSEADDR can listen there
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    again.bind(("127.0.0.1", port))
    again.listen()
    again.close()
