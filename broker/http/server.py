"""Running the gateway: ``raftbroker serve --http HOST:PORT`` starts it in the node's process.

It runs on its own thread with its own event loop (uvicorn), beside the node's gRPC server, and
reaches the cluster through the SDK like any client: this node's gRPC address first, then the
peers' (so it forwards writes to whichever node leads). In the node's process, not beside it:
one process per node to deploy, start and kill, and the gateway lives and dies with its node.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import uvicorn

from broker.client.security import ClientSecurity
from broker.http.app import create_app
from broker.http.body_limit import BODY_BYTES_MAX
from broker.http.guard import HTTP_LIMITS, HttpLimits, protocol_class

log = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the HTTP address must be HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


class Gateway:
    """A gateway serving on its own thread; :meth:`stop` ends it and closes its gRPC channels.

    Stop it before the process exits: a daemon thread left running an event loop with open gRPC
    channels meets the interpreter's finalization, and gRPC's threads calling back into a
    finalizing interpreter can abort the process (a CI run whose tests had all passed, with a
    gateway left running, ended in SIGABRT)."""

    def __init__(self, server: uvicorn.Server, thread: threading.Thread) -> None:
        self._server = server
        self.thread = thread

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Ask uvicorn to exit (open requests get ``timeout_graceful_shutdown``, then the lifespan
        closes the client) and wait up to ``timeout_s``; True when the thread ended."""
        self._server.should_exit = True
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


def start_in_thread(address: str, bootstrap: Sequence[str], security: ClientSecurity | None = None,
                    body_bytes_max: int = BODY_BYTES_MAX, limits: HttpLimits = HTTP_LIMITS) -> Gateway:
    """Serve the gateway on ``address`` (HOST:PORT) on a daemon thread.
    ``security``: TLS towards TLS nodes (``broker.security.node.gateway_security``); None: plaintext.
    ``body_bytes_max``: the request body cap (``broker.http.body_limit.body_bytes_max``).
    ``limits``: the connections' deadlines and cap, and the live watches' cap (:mod:`broker.http.guard`)."""
    host, port = parse_address(address)
    app = create_app(bootstrap, security=security, body_bytes_max=body_bytes_max, watches_max=limits.watches_max)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=1, http=protocol_class(limits))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="raftbroker-http", daemon=True)
    thread.start()
    log.info("HTTP gateway on http://%s:%d (cluster via %s)", host, port, ", ".join(bootstrap))
    return Gateway(server, thread)
