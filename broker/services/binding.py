"""A listen address a node cannot bind at start, said in one line that names the address, the setting
that chose it and the operating system's reason.

The gRPC server binds ``grpc_address`` (``--grpc``) as the node is built, and the node checks
``metrics_address`` (``--metrics``) before its Raft starts (:func:`check_free`; the metrics server
checks again as it binds). Each raises :class:`BindFailed`, whose message ``raftbroker serve``
prints as one line before it exits 2, as for an invalid setting (docs/operations.md). The Raft port is not here:
pysyncobj binds it on its tick thread and retries every second until the port is free.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from broker.listen import Unresolved, bind_failure


@dataclass(frozen=True)
class Listener:
    """One of a node's listening ports: what it serves and the setting and flag that set its address."""

    what: str
    setting: str
    flag: str


GRPC = Listener("gRPC", "grpc_address", "--grpc")
METRICS = Listener("metrics", "metrics_address", "--metrics")

# what the OS's reasons mean here
_HINTS = {
    errno.EADDRINUSE: "another process, or an earlier node still running, listens on that port",
    errno.EADDRNOTAVAIL: "no network interface of this host has that address",
    errno.EACCES: "a port below 1024 needs privileges",
}


class BindFailed(OSError):
    """``listener`` cannot listen on ``address``; ``reason`` says why (the OS's error, with a hint)."""

    def __init__(self, listener: Listener, address: str, reason: str) -> None:
        assert address and reason, "name the address and the reason"
        super().__init__(f"cannot listen on {address}, the {listener.what} address "
                         f"({listener.flag} / {listener.setting}): {reason}")
        self.listener = listener
        self.address = address


def describe(exc: OSError) -> str:
    """``exc``, a failed bind, as a reason: the OS's text and, for the common causes, what it means."""
    hint = _HINTS.get(exc.errno) if exc.errno is not None else None
    text = exc.strerror or str(exc)
    return f"{text} ({hint})" if hint else text


def check_free(listener: Listener, address: str) -> None:
    """Raise :class:`BindFailed` when ``address`` cannot be bound now: a node checks its ports before
    its Raft starts, so a taken one stops it before it has taken part in any election."""
    reason = bind_error(address)
    if reason:
        raise BindFailed(listener, address, reason)


def bind_error(address: str) -> str:
    """Why ``address`` (HOST:PORT) cannot be bound right now (:func:`broker.listen.bind_failure`),
    said as :func:`describe` says it; "" when it can be. For a server, such as gRPC's, that reports
    a failed bind without the OS's reason."""
    failure = bind_failure(address)
    if failure is None:
        return ""
    return str(failure) if isinstance(failure, Unresolved) else describe(failure)
