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

log = logging.getLogger(__name__)


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"the HTTP address must be HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def start_in_thread(address: str, bootstrap: Sequence[str], security: ClientSecurity | None = None
                    ) -> threading.Thread:
    """Serve the gateway on ``address`` (HOST:PORT) on a daemon thread; returns the thread.
    ``security``: TLS towards TLS nodes (``broker.security.node.gateway_security``); None: plaintext."""
    host, port = parse_address(address)
    app = create_app(bootstrap, security=security)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="raftbroker-http", daemon=True)
    thread.start()
    log.info("HTTP gateway on http://%s:%d (cluster via %s)", host, port, ", ".join(bootstrap))
    return thread
