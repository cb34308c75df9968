"""The SDK side of mirroring (SPEC §3.4): how a router appends its copies to another cluster.

A router (``broker.leader.router``) holds one :class:`MirrorClient` per remote cluster. Calls go
through the same leader discovery and retry loop as every SDK call; they use the ``Mirror``
service, which accepts stored record bodies with their origin kept (the public ``Publish`` never
lets a caller choose an origin). Every copy carries an idempotency key, so a retried append is
stored once. Attempts are short (``timeout_s``, ``retry_deadline_s``): a router retries a
failing route itself, with backoff, on the lane (thread) of that remote cluster, so a slow or
unreachable cluster holds up only the routes to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from broker.client.errors import BrokerError
from broker.client.routing import RetryPolicy, Router
from broker.client.security import ClientSecurity
from broker.v1 import routes_pb2, routes_pb2_grpc


class MirrorCopy(Protocol):
    """One copy as a router hands it over (``broker.leader.route_copies.Copy``)."""

    @property
    def body(self) -> bytes: ...

    @property
    def partition_key(self) -> bytes | None: ...

    @property
    def source_partition(self) -> int: ...

    @property
    def idempotency_key(self) -> str: ...


class MirrorClient:
    """A connection to a remote cluster for one router lane: calls from one thread at a time;
    :meth:`close` may come from any thread and cancels a call in flight (it then raises)."""

    def __init__(self, bootstrap: Sequence[str], *, timeout_s: float = 5.0, retry_deadline_s: float = 3.0,
                 security: ClientSecurity | None = None) -> None:
        """``security``: TLS and token for a secured remote cluster (its principal needs ``mirror``)."""
        self._router = Router(list(bootstrap), RetryPolicy(timeout_s=timeout_s, retry_deadline_s=retry_deadline_s),
                              security)
        self._cluster_id: str | None = None

    def _stub(self, address: str) -> routes_pb2_grpc.MirrorStub:
        # made once per address under the Router's lock: close() may come from another thread
        return self._router.stub(address, routes_pb2_grpc.MirrorStub)

    def cluster_id(self) -> str:
        """The remote cluster's id (asked once, then remembered)."""
        if self._cluster_id is None:
            response = self._router.call(
                lambda addr, t: self._stub(addr).Identify(routes_pb2.IdentifyRequest(), timeout=t),
                write=False, what="identify the remote cluster")
            if not response.cluster_id:
                raise BrokerError("FAILED_PRECONDITION", "the remote cluster did not say its cluster id")
            self._cluster_id = response.cluster_id
        return self._cluster_id

    def append(self, topic: str, copies: Sequence[MirrorCopy]) -> list[routes_pb2.MirrorResult]:
        """Append ``copies`` to ``topic`` of the remote cluster, all or nothing, in order."""
        request = routes_pb2.MirrorAppendRequest(topic=topic)
        for copy in copies:
            record = request.records.add(body=copy.body, source_partition=copy.source_partition,
                                         idempotency_key=copy.idempotency_key)
            if copy.partition_key is not None:
                record.partition_key = copy.partition_key
        response = self._router.call(lambda addr, t: self._stub(addr).Append(request, timeout=t),
                                     write=True, what=f"mirror {len(copies)} record(s) to {topic}")
        return list(response.results)

    def close(self) -> None:
        self._router.close()


def identify_cluster(addresses: Sequence[str], *, security: ClientSecurity | None = None,
                     timeout_s: float = 2.0) -> str | None:
    """The cluster id of the cluster at ``addresses``, or None when none of them answers within
    about ``timeout_s`` (or it does not say)."""
    client = MirrorClient(addresses, timeout_s=timeout_s, retry_deadline_s=timeout_s, security=security)
    try:
        return client.cluster_id()
    except BrokerError:
        return None
    finally:
        client.close()
