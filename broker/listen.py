"""Why a listen address cannot be bound right now, asked of the operating system by binding it.

A server that reports a failed bind without the OS's reason (gRPC's, pysyncobj's Raft port) is
followed by :func:`bind_failure`, which binds each address ``HOST:PORT`` resolves to as those
servers bind (SO_REUSEADDR: a port left in TIME_WAIT counts as free) and returns the first error.
Used by ``broker.services.binding`` (the gRPC, metrics and HTTP addresses) and
``broker.replication.transport`` (the Raft address), which each say it in their own words.
"""

from __future__ import annotations

import socket


class Unresolved(OSError):
    """The address's host does not resolve (or its port is not a number)."""


def bind_failure(address: str) -> OSError | None:
    """The error binding ``address`` (HOST:PORT) gives now; None when it can be bound."""
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, ValueError) as exc:
        return Unresolved(f"cannot resolve it: {exc}")
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                return exc
    return None
