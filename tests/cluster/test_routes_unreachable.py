"""Routes to another cluster that cannot be reached hold up no other route (SPEC §3.4, "Errors never
stall other routes"): the leader runs each remote cluster's routes on a thread of its own."""

from __future__ import annotations

import functools
import json
import socket
import time

import pytest

from broker.client import Client, RouteInfo
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

# A local copy takes ~0.01 s; one attempt towards a dead cluster blocks for the SDK's retry deadline
# (3 s, connection refused) or its per-call timeout (5 s, a peer that never answers). The bound is
# generous for a loaded CI machine and still well below either.
COPY_S_MAX = 2.5
WINDOW_S = 15.0  # several attempts of each dead route (each attempt up to 5 s, backoff 0.2 s -> 5 s)


def failed_route(client: Client, name: str) -> RouteInfo | None:
    route = client.route(name)
    return route if route.last_error else None


def test_a_local_route_keeps_copying_while_routes_to_dead_clusters_fail(fresh_cluster: DevCluster) -> None:
    refused = socket.socket()  # bound, not listening: every connection is refused
    silent = socket.socket()  # listening, never accepting or answering: every call runs to its deadline
    try:
        refused.bind(("127.0.0.1", 0))
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        with Client(fresh_cluster.addresses) as client:
            client.create_topic("src", 1)
            client.create_topic("dst", 1)
            client.create_route("local", "src", "dst")
            for name, sock in (("dead-refused", refused), ("dead-silent", silent)):
                client.create_route(name, "src", "mirror", target_cluster=f"127.0.0.1:{sock.getsockname()[1]}")
            copies_s: list[float] = []
            window_end = time.monotonic() + WINDOW_S
            while time.monotonic() < window_end:
                client.publish("src", json.dumps({"n": len(copies_s)}))
                published = time.monotonic()
                while client.describe_topic("dst").records <= len(copies_s):
                    waited_s = time.monotonic() - published
                    assert waited_s < COPY_S_MAX, (
                        f"copy {len(copies_s)} took over {waited_s:.2f} s (the routes to dead clusters held the "
                        f"router); earlier copies took at most {max(copies_s, default=0.0):.2f} s")
                    time.sleep(0.01)
                copies_s.append(time.monotonic() - published)
            for name in ("dead-refused", "dead-silent"):  # the dead routes did try (and fail) meanwhile
                dead = wait_until(functools.partial(failed_route, client, name), 30, f"{name} to report its failure")
                assert isinstance(dead, RouteInfo) and dead.lag > 0 and dead.copied == 0
            route = client.route("local")
            assert route.lag == 0 and route.copied == len(copies_s) and not route.last_error
    finally:
        refused.close()
        silent.close()
    assert len(copies_s) >= 20, f"only {len(copies_s)} copies in {WINDOW_S:g} s"
