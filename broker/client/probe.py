"""Ask exactly one node: :class:`NodeProbe` (tools, tests and drills that watch single nodes).

A :class:`~broker.client.Client` follows the leader and retries on other nodes; a probe does
neither. Every call goes to the one address it was made for, once, bounded by ``timeout_s``, and
a failure is raised at once as its SDK error (:func:`~broker.client.errors.error_from_rpc`:
a node that is down or does not answer in time is :class:`~broker.client.errors.Unavailable` /
:class:`~broker.client.errors.DeadlineExceeded`). The answers are that node's own view, which
may be stale or differ from the leader's: that is the point (a drill compares the nodes).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from broker.client import wire
from broker.client.errors import error_from_rpc, invalid_argument
from broker.client.models import ClusterStatus, Event, NodeInfo, Record
from broker.client.security import ClientSecurity
from broker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc

PROBE_TIMEOUT_S_DEFAULT = 1.0
_RECEIVE_BYTES_MAX = 64 * 1024 * 1024


class NodeProbe:
    """A channel to one node ``address`` (``host:port``) and the calls that ask only it.

    ``security``: TLS and token as for a :class:`~broker.client.Client` (None: plaintext).
    ``timeout_s``: the default limit of one call (> 0). Thread-safe; use as a context manager or
    call :meth:`close`.
    """

    def __init__(self, address: str, *, security: ClientSecurity | None = None,
                 timeout_s: float = PROBE_TIMEOUT_S_DEFAULT) -> None:
        if not address.strip():
            raise ValueError("a probe needs one host:port address")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.address = address.strip()
        self.timeout_s = timeout_s
        options = [("grpc.max_receive_message_length", _RECEIVE_BYTES_MAX),
                   ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]
        if security is None:
            self._channel = grpc.insecure_channel(self.address, options=options)
        else:
            self._channel = grpc.secure_channel(self.address, security.channel_credentials(),
                                                options=options + security.channel_options())
        self._admin = admin_pb2_grpc.AdminStub(self._channel)
        self._broker = broker_pb2_grpc.BrokerStub(self._channel)

    def __enter__(self) -> NodeProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel; a read in progress ends with an error."""
        self._channel.close()

    def node_status(self, *, timeout_s: float | None = None) -> NodeInfo:
        """This node's own view: its id, role, term, commit and applied index and whom it takes
        for the leader (``leader_id``, empty when it knows none). Never redirected."""
        try:
            msg = self._admin.NodeStatus(admin_pb2.NodeStatusRequest(), timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        return wire.node_info(msg)

    def cluster_status(self, *, timeout_s: float | None = None) -> ClusterStatus:
        """The cluster as this node sees it: the members of its current configuration (its own
        Raft log's view, which lags the leader's while a change is being replicated)."""
        try:
            msg = self._admin.ClusterStatus(admin_pb2.ClusterStatusRequest(), timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        return wire.cluster_status(msg)

    def read_partition(self, topic: str, partition: int, *, max_batch: int = 5000,
                       timeout_s: float | None = None) -> Iterator[Record | Event]:
        """Every record and event this node holds of ``topic``/``partition`` now, from the start
        (``stop_at_end``): no resume, no other node. ``timeout_s`` bounds the whole read. A failure
        (also mid-read) raises its :class:`~broker.client.errors.BrokerError`; items yielded before
        it stand."""
        if partition < 0:
            raise invalid_argument(f"partition must be >= 0, got {partition}")
        if max_batch < 1:
            raise invalid_argument(f"max_batch must be >= 1, got {max_batch}")
        request = broker_pb2.SubscribeRequest(topic=topic, partition=partition, stop_at_end=True,
                                              max_batch=max_batch)
        try:
            for item in self._broker.Subscribe(request, timeout=timeout_s or self.timeout_s):
                if item.HasField("batch"):
                    yield from (wire.record(r) for r in item.batch.records)
                elif item.HasField("event"):
                    yield wire.event(item.event)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
