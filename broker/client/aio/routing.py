"""The asyncio router: ``grpc.aio`` channels per node, the leader guess, and the retry loop.

Same contract as the sync :class:`broker.client.routing.Router` (read its module docstring): the
rules that decide what a failed attempt means (:func:`~broker.client.routing.classify`), the
backoff, the retry policy and the lost-majority watch are the sync SDK's own, imported, not
copied; only the waiting is asyncio (``await asyncio.sleep``, no thread per call).

Per-call metadata: :data:`call_metadata` (a context variable) is sent with every call made in its
context, e.g. ``authorization: Bearer ...`` that the HTTP gateway passes through per request.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, cast

import grpc
import grpc.aio

from broker.client.calls import AdminCall
from broker.client.errors import BrokerError, Unavailable, error_from_rpc, rpc_code, rpc_details
from broker.client.packing import PublishBytesStub
from broker.client.routing import _CHANNEL_OPTIONS, Backoff, Outcome, QuorumWatch, RetryPolicy, TlsWatch, classify
from broker.client.security import ClientSecurity, answers_tls
from broker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2_grpc

T = TypeVar("T")
S = TypeVar("S")
AsyncCall = Callable[[str, float], Awaitable[T]]
Metadata = tuple[tuple[str, str], ...]

DISCOVERY_TIMEOUT_S = 2.0
DISCOVERY_INTERVAL_S = 0.5

#: Metadata sent with every call made in the current context (e.g. ``(("authorization", "Bearer x"),)``).
call_metadata: contextvars.ContextVar[Metadata] = contextvars.ContextVar("raftbroker_call_metadata", default=())


def metadata() -> Metadata | None:
    """The metadata for a call made now (None when there is none)."""
    return call_metadata.get() or None


class AsyncRouter:
    """One ``grpc.aio`` channel per node address and the leader guess. Use from one event loop."""

    def __init__(self, bootstrap: Sequence[str], policy: RetryPolicy, security: ClientSecurity | None = None) -> None:
        """``security``: TLS (and a token) for every channel, as the sync client's; None: plaintext."""
        known = [a.strip() for a in bootstrap if a.strip()]
        if not known:
            raise ValueError("bootstrap needs at least one host:port address")
        self.policy = policy
        self._known = list(dict.fromkeys(known))
        self._leader: str | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[tuple[object, str], object] = {}
        self._closed = False
        self._next_discovery = 0.0
        self._members_task: asyncio.Task[bool] | None = None
        self._credentials = security.channel_credentials() if security is not None else None
        self._options = [*_CHANNEL_OPTIONS, *(security.channel_options() if security is not None else [])]
        self.answers_tls: dict[str, bool] = {}  # by address, once probed (TlsWatch)

    # -- channels -------------------------------------------------------------------------------
    def channel(self, address: str) -> grpc.aio.Channel:
        if self._closed:
            raise BrokerError("CANCELLED", "the client is closed")
        chan = self._channels.get(address)
        if chan is None:
            if self._credentials is None:
                chan = grpc.aio.insecure_channel(address, options=self._options)
            else:
                chan = grpc.aio.secure_channel(address, self._credentials, options=self._options)
            self._channels[address] = chan
        return chan

    def stub(self, address: str, factory: Callable[[grpc.aio.Channel], S]) -> S:
        stub = self._stubs.get((factory, address))
        if stub is None:
            stub = factory(self.channel(address))
            self._stubs[(factory, address)] = stub
        return cast(S, stub)

    def broker(self, address: str) -> broker_pb2_grpc.BrokerStub:
        return self.stub(address, broker_pb2_grpc.BrokerStub)

    def admin(self, address: str) -> admin_pb2_grpc.AdminStub:
        return self.stub(address, admin_pb2_grpc.AdminStub)

    def publisher(self, address: str) -> PublishBytesStub:
        """``Broker.Publish`` taking a request's bytes (``wire.PublishCall.data``)."""
        return self.stub(address, PublishBytesStub)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called: every call and stream then ends with an error."""
        return self._closed

    async def close(self) -> None:
        self._closed = True
        if self._members_task is not None:
            self._members_task.cancel()
        channels, self._channels = list(self._channels.values()), {}
        self._stubs.clear()
        for chan in channels:
            await chan.close()

    # -- leader guess ---------------------------------------------------------------------------
    @property
    def known_addresses(self) -> list[str]:
        return list(self._known)

    @property
    def leader(self) -> str | None:
        return self._leader

    def learn(self, address: str, *, is_leader: bool = False) -> None:
        if address not in self._known:
            self._known.append(address)
        if is_leader:
            self._leader = address

    def forget_leader(self, address: str) -> None:
        if self._leader == address:
            self._leader = None

    def next_address(self, after: str | None) -> str:
        if after not in self._known:
            return self._known[0]
        return self._known[(self._known.index(after) + 1) % len(self._known)]

    async def read_address(self) -> str:
        return self._leader or await self.discover_leader() or self.next_address(None)

    async def discover_leader(self) -> str | None:
        """Ask the known nodes who leads (NodeStatus, then ClusterStatus for an address)."""
        now = time.monotonic()
        if now < self._next_discovery:
            return self._leader
        self._next_discovery = now + DISCOVERY_INTERVAL_S
        for address in self.known_addresses:
            try:
                node = await self.admin(address).NodeStatus(admin_pb2.NodeStatusRequest(),
                                                            timeout=DISCOVERY_TIMEOUT_S, metadata=metadata())
            except grpc.RpcError:
                continue
            if node.role == "leader":
                self.learn(address, is_leader=True)
                return address
            if node.leader_id and await self._learn_members(address, node.leader_id):
                return self._leader
        return None

    async def _learn_members(self, address: str, leader_id: str = "") -> bool:
        try:
            status = await self.admin(address).ClusterStatus(admin_pb2.ClusterStatusRequest(),
                                                             timeout=DISCOVERY_TIMEOUT_S, metadata=metadata())
        except (grpc.RpcError, BrokerError):
            return False
        for node in status.nodes:
            if node.grpc_address:
                self.learn(node.grpc_address, is_leader=bool(leader_id) and node.id == leader_id)
        return True

    def learn_members_soon(self, address: str) -> None:
        """Once per router, learn every node's address from ``address`` in the background."""
        if self._members_task is None and not self._closed:
            self._members_task = asyncio.get_running_loop().create_task(self._learn_members(address))

    def tls_watch(self) -> TlsWatch:
        """A :class:`~broker.client.routing.TlsWatch` for one call's attempts (or one stream's reopenings)."""
        return TlsWatch(self._credentials is not None, self.answers_tls)

    async def disagree_on_tls(self, watch: TlsWatch, address: str, err: grpc.RpcError) -> bool:
        """:meth:`broker.client.routing.Router.disagree_on_tls` (the probe runs in a thread)."""
        if watch.wants_probe(address, err):
            self.answers_tls[address] = await asyncio.to_thread(answers_tls, address)
        watch.note(address, err)
        return watch.covers(self.known_addresses)

    # -- the retry loop -------------------------------------------------------------------------
    async def admin_call(self, call: AdminCall[T]) -> T:
        """Run ``call`` (:mod:`broker.client.calls`) as :meth:`call` runs any call; its parsed answer
        (the sync :meth:`broker.client.routing.Router.admin_call`, awaited)."""
        response = await self.call(
            lambda a, t: getattr(self.admin(a), call.method)(call.request, timeout=t, metadata=metadata()),
            write=call.write, what=call.what)
        return call.parse(response)

    async def call(self, fn: AsyncCall[T], *, write: bool, what: str) -> T:
        """``await fn(address, timeout_s)`` on the leader, following redirects and retrying
        (the contract of :meth:`broker.client.routing.Router.call`)."""
        policy = self.policy
        deadline = time.monotonic() + policy.retry_deadline_s
        backoff = Backoff(policy.backoff_initial_s, policy.backoff_max_s)
        address = (self._leader or self.next_address(None)) if write else await self.read_address()
        unknown_outcome, redirects, tried = False, 0, []
        rotation = address  # where the round-robin goes on from (a hinted leader is not part of it)
        quorum = QuorumWatch(policy.no_quorum_grace_s)
        tls = self.tls_watch()
        while True:
            tried.append(address)
            try:
                result = await fn(address, policy.timeout_s)
            except asyncio.CancelledError:
                # grpc.aio ends a call its closing channel cancelled with CancelledError, as if the
                # caller's task had been cancelled: say what happened, and that a write may have landed
                task = asyncio.current_task()
                if self._closed and task is not None and task.cancelling() == 0:
                    raise BrokerError("CANCELLED", f"{what}: the client was closed",
                                      after_unknown_outcome=write or unknown_outcome) from None
                raise
            except grpc.RpcError as err:
                if self._closed:  # its channel closed under it: a write's outcome is not known
                    raise BrokerError("CANCELLED", f"{what}: the client was closed",
                                      after_unknown_outcome=write or unknown_outcome) from None
                outcome, hint = classify(err)
                if outcome is Outcome.FINAL:
                    raise error_from_rpc(err, after_unknown_outcome=unknown_outcome) from None
                unknown_outcome = unknown_outcome or (write and outcome is Outcome.UNKNOWN)
                if quorum.note(address, outcome, err) and quorum.covers(self.known_addresses):
                    raise quorum.lost(what, unknown_outcome) from None
                if await self.disagree_on_tls(tls, address, err):
                    raise tls.error(what, unknown_outcome) from None
                pause = True
                if hint is not None:
                    redirects += 1
                    self.learn(hint, is_leader=True)
                    pause, address = redirects > policy.redirects_max, hint
                else:  # round-robin on from the last node tried unhinted: after a dead hint, the next one
                    redirects = 0
                    self.forget_leader(address)
                    address = rotation = self.next_address(rotation)
                delay = backoff.next_delay_s() if pause else 0.0
                if time.monotonic() + delay >= deadline:
                    last = quorum.last_answer or err
                    nodes = ", ".join(dict.fromkeys(tried))
                    raise Unavailable("UNAVAILABLE", f"{what}: no leader answered within {policy.retry_deadline_s:g}s "
                                      f"(tried {nodes}); last error: {rpc_code(last).name}: {rpc_details(last)}",
                                      after_unknown_outcome=unknown_outcome) from None
                await asyncio.sleep(delay)
                continue
            if write:
                self.learn(address, is_leader=True)
            self.learn_members_soon(address)
            return result
