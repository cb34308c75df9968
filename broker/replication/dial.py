"""Redirecting this process's outgoing Raft connections (the chaos drills' proxy fabric).

``redirect_dials({"peer raft host:port": "proxy host:port"})`` makes pysyncobj dial the proxy
instead of the peer; addresses not in the map are dialled as they are. Nothing else changes: the
node binds and announces its own Raft address. Only for a process started to sit behind proxies
(``python -m chaos.node_shim``); a production node never calls it. It lives here because only
``broker/replication`` imports pysyncobj.
"""

from __future__ import annotations

from typing import Any

from pysyncobj import tcp_connection


def redirect_dials(dial: dict[str, str]) -> None:
    """Redirect pysyncobj's outgoing connects per ``dial`` (for the rest of this process)."""
    original = tcp_connection.TcpConnection.connect

    def connect(self: Any, host: str, port: int) -> bool:
        target = dial.get(f"{host}:{port}")
        if target is not None:
            proxy_host, _, proxy_port = target.rpartition(":")
            host, port = proxy_host, int(proxy_port)
        return bool(original(self, host, port))

    tcp_connection.TcpConnection.connect = connect
