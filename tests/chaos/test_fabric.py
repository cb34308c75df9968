"""The network fabrics cut and heal links and leave nothing behind (namespaces, links, proxies)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading

import pytest

from chaos.net.netns import NetnsFabric, cleanup_all, leftovers
from chaos.net.proxy import ProxyFabric
from tests.chaos.availability import require_netns
from tests.conftest import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]


def _echo_server() -> tuple[socket.socket, str]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            data = conn.recv(100)
            conn.sendall(data)
            conn.close()

    threading.Thread(target=serve, name="echo-server", daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


def _stop(server: socket.socket) -> None:
    """Close a listening socket and wake its accept (close alone does not, on Linux)."""
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)
    server.close()


def _roundtrip(address: str, timeout_s: float = 1.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as s:
            s.sendall(b"ping")
            return s.recv(4) == b"ping"
    except OSError:
        return False


def test_proxy_links_forward_and_a_cut_refuses_until_healed() -> None:
    server, address = _echo_server()
    fabric = ProxyFabric(2, "aaaaaa", seed=1)
    try:
        fabric.prepare([address, address])
        link = fabric.proxies[(0, 1)].address
        assert _roundtrip(link)
        fabric.cut([(0, 1)])
        assert not _roundtrip(link)
        fabric.heal()
        assert _roundtrip(link)
        assert '"127.0.0.1' in fabric.env(0)["RAFTBROKER_CHAOS_DIAL"]
        proxies = list(fabric.proxies.values())
    finally:
        fabric.close()
        _stop(server)
    # close() stops every proxy's accept thread (the unused link's too), not just its socket
    assert [p.address for p in proxies if p.thread.is_alive()] == []


def test_netns_cut_drops_node_traffic_not_client_traffic_and_close_removes_everything() -> None:
    require_netns()
    fabric = NetnsFabric(2, "bbbbbb")
    try:
        assert "rbchaos-bbbbbb-n1" in leftovers()
        server = subprocess.Popen(fabric.wrap(1, ["python3", "-c", (
            "import socket\n"
            f"s=socket.create_server(('{fabric.host(1)}', 9000))\n"
            "while True:\n c,_=s.accept(); c.sendall(c.recv(4)); c.close()\n")]))
        try:
            def from_node0() -> bool:
                probe = (f"import socket;s=socket.create_connection(('{fabric.host(1)}',9000),timeout=1);"
                         "s.sendall(b'ping');print(s.recv(4)==b'ping')")
                out = subprocess.run(fabric.wrap(0, ["python3", "-c", probe]), capture_output=True, text=True)
                return out.stdout.strip() == "True"

            wait_until(lambda: _roundtrip(f"{fabric.host(1)}:9000"), 10, "the drill (root namespace) to reach the node")
            assert from_node0()
            fabric.cut([(0, 1)])
            assert not from_node0()
            assert _roundtrip(f"{fabric.host(1)}:9000"), "clients are never cut off"
            fabric.heal()
            assert from_node0()
        finally:
            server.kill()
            server.wait()
    finally:
        fabric.close()
    assert not [n for n in leftovers() if "bbbbbb" in n]


def test_cleanup_from_a_fresh_process_removes_what_a_killed_drill_left() -> None:
    require_netns()
    fabric = NetnsFabric(1, "cccccc")
    fabric._created.clear()  # as if the drill died before closing it
    assert [n for n in leftovers() if "cccccc" in n]
    removed = cleanup_all("cccccc")
    assert removed and not [n for n in leftovers() if "cccccc" in n]
