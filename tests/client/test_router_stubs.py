"""Stubs are made once per channel and never while the router closes it (grpc's method
registration is not thread-safe; overlapping it with a close crashed test processes)."""

from __future__ import annotations

import threading

import pytest

from broker.client.errors import BrokerError
from broker.client.routing import RetryPolicy, Router

pytestmark = pytest.mark.unit
ADDRESS = "127.0.0.1:9"  # never connected: making stubs needs no server


def test_stubs_are_made_once_per_address_and_refused_after_close() -> None:
    router = Router([ADDRESS], RetryPolicy())
    assert router.broker(ADDRESS) is router.broker(ADDRESS)
    assert router.admin(ADDRESS) is router.admin(ADDRESS)
    router.close()
    with pytest.raises(BrokerError, match="closed"):
        router.admin(ADDRESS)


def test_many_threads_making_stubs_while_the_router_closes() -> None:
    for _ in range(200):
        router = Router([ADDRESS, "127.0.0.1:10"], RetryPolicy())
        go = threading.Event()

        def hammer(router: Router = router, go: threading.Event = go) -> None:
            go.wait()
            for i in range(20):
                try:
                    router.admin(ADDRESS)
                    router.broker("127.0.0.1:10" if i % 2 else ADDRESS)
                except BrokerError:
                    return

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads:
            t.start()
        go.set()
        router.close()
        for t in threads:
            t.join()
