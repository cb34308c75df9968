"""Channels per node, the leader guess, and the retry loop every unary call runs through.

Contract of :meth:`Router.call`:
- a refusal naming the leader (``x-leader`` trailing metadata) is followed at once: the request
  was provably not applied;
- a refusal without a leader (election), a connection that fails or drops, and a deadline are
  retried on the next known node after a short capped backoff, until ``retry_deadline_s`` has
  passed; then :class:`~broker.client.errors.Unavailable` is raised;
- a cluster that lost its majority is not waited for: once every known node either refused with
  "no quorum" (the ``x-no-quorum`` trailer) or could not be reached, for ``no_quorum_grace_s``
  (so a node still connecting after a restart is not taken for a lost majority), the call raises
  :class:`~broker.client.errors.Unavailable` saying so; the retry deadline is for failovers;
- any other status is final and raised as its SDK error at once.
After its first answered call a router learns every node's address (ClusterStatus, in the
background), so "the other known nodes" include nodes missing from the bootstrap list.
A write retried after a dropped connection or a deadline may have been applied by the earlier
attempt: the router resends the very same request, so callers make writes idempotent (a publish
carries idempotency keys, see :meth:`broker.client.Client.publish_batch`; create/drop check
``after_unknown_outcome``). A final error after such a retry carries ``after_unknown_outcome=True``.
"""

from __future__ import annotations

import enum
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import grpc

from broker.client.calls import AdminCall
from broker.client.errors import (
    BrokerError,
    Unavailable,
    error_from_rpc,
    error_info,
    gave_up,
    leader_hint,
    rpc_code,
    rpc_details,
    says_no_quorum,
)
from broker.client.packing import PublishBytesStub
from broker.client.security import CLIENT_CONFIG_ENV, ClientSecurity, answers_tls
from broker.reasons import Reason
from broker.v1 import admin_pb2, admin_pb2_grpc, broker_pb2_grpc

T = TypeVar("T")
S = TypeVar("S")
Call = Callable[[str, float], T]

_CHANNEL_OPTIONS = [
    # A killed node that comes back is reachable again within a second, not after minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]
_DISCOVERY_TIMEOUT_S = 2.0
# One attempt's longest timeout: a day. gRPC keeps a deadline in int64 nanoseconds, and one past
# ~9.2e9 s overflows into the past (every call then fails at once with DEADLINE_EXCEEDED).
TIMEOUT_S_MAX = 86_400.0
_DISCOVERY_INTERVAL_S = 0.5


@dataclass(frozen=True)
class RetryPolicy:
    """Limits of one call: per-attempt timeout, total retry time, backoff between nodes."""

    timeout_s: float = 10.0
    retry_deadline_s: float = 30.0
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 0.5
    redirects_max: int = 3  # consecutive redirects followed without pausing
    no_quorum_grace_s: float = 1.0  # how long "no quorum" from every reachable node must last

    def __post_init__(self) -> None:
        if (not 0 < self.timeout_s <= TIMEOUT_S_MAX or self.retry_deadline_s < 0
                or not 0 <= self.no_quorum_grace_s <= 60):
            raise ValueError(f"timeout_s must be within (0, {TIMEOUT_S_MAX:g}], retry_deadline_s not negative and "
                             f"no_quorum_grace_s within [0, 60]; got {self.timeout_s}, {self.retry_deadline_s} and "
                             f"{self.no_quorum_grace_s}")


class Backoff:
    """Capped exponential backoff with jitter: ``initial * 2**n``, at most ``cap_s``."""

    def __init__(self, initial_s: float, cap_s: float) -> None:
        assert 0 < initial_s <= cap_s
        self._initial_s = initial_s
        self._cap_s = cap_s
        self._attempt = 0

    def next_delay_s(self) -> float:
        delay = min(self._cap_s, self._initial_s * 2**self._attempt)
        self._attempt = min(self._attempt + 1, 16)
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self._attempt = 0


class Outcome(enum.Enum):
    """What a failed attempt tells about the request."""

    REDIRECTED = "redirected"  # a follower named the leader: not applied
    NOT_SENT = "not_sent"  # the connection could not be made: not applied
    UNKNOWN = "unknown"  # no leader / dropped / deadline: maybe applied, retry
    NO_QUORUM = "no_quorum"  # the node reaches no majority: not applied
    FINAL = "final"  # an answer to report to the caller


def classify(err: grpc.RpcError) -> tuple[Outcome, str | None]:
    """The outcome of a failed attempt and the leader address it named, if any."""
    code = rpc_code(err)
    hint = leader_hint(err)
    if code is grpc.StatusCode.UNAVAILABLE and says_no_quorum(err):
        return Outcome.NO_QUORUM, hint  # a redirect from a node without a quorum: follow it, but note it
    if hint and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION):
        return Outcome.REDIRECTED, hint
    if code is grpc.StatusCode.UNAVAILABLE:
        details = rpc_details(err).lower()
        if "failed to connect" in details or "connection refused" in details:
            return Outcome.NOT_SENT, None
        return Outcome.UNKNOWN, None
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return Outcome.UNKNOWN, None
    if code is grpc.StatusCode.UNAUTHENTICATED and _reason(err) == Reason.STREAM_REAUTHENTICATE:
        # an open stream whose token no longer authenticates (rotated, or revoked): nothing of the
        # refused step was done, and a new stream carries the token held now (a revoked one is refused
        # as it opens, without this reason: final)
        return Outcome.NOT_SENT, None
    return Outcome.FINAL, None


def _reason(err: grpc.RpcError) -> str:
    info = error_info(err)
    return info.reason if info is not None else ""


def is_retryable(err: grpc.RpcError) -> bool:
    return classify(err)[0] is not Outcome.FINAL


class Router:
    """Owns one channel per node address and the current leader guess; thread-safe."""

    def __init__(self, bootstrap: Sequence[str], policy: RetryPolicy, security: ClientSecurity | None = None) -> None:
        """``security``: TLS and token for every channel (redirects included); None: plaintext."""
        self._credentials = security.channel_credentials() if security is not None else None
        self._options = _CHANNEL_OPTIONS + (security.channel_options() if security is not None else [])
        self.answers_tls: dict[str, bool] = {}  # by address, once probed (TlsWatch)
        known = [a.strip() for a in bootstrap if a.strip()]
        if not known:
            raise ValueError("bootstrap needs at least one host:port address")
        self.policy = policy
        self._known = list(dict.fromkeys(known))
        self._leader: str | None = None
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[tuple[object, str], object] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._next_discovery = 0.0
        self._members_asked = False

    # -- channels -------------------------------------------------------------------------------

    def channel(self, address: str) -> grpc.Channel:
        """The (reused) channel to ``address``."""
        with self._lock:
            return self._channel_locked(address)

    def _channel_locked(self, address: str) -> grpc.Channel:
        if self._closed:
            raise BrokerError("CANCELLED", "the client is closed")
        chan = self._channels.get(address)
        if chan is None:
            if self._credentials is None:
                chan = grpc.insecure_channel(address, options=self._options)
            else:
                chan = grpc.secure_channel(address, self._credentials, options=self._options)
            self._channels[address] = chan
        return chan

    def stub(self, address: str, factory: Callable[[grpc.Channel], S]) -> S:
        """The stub of ``factory`` for ``address``, made once. Making a stub registers its methods on
        the channel, which grpc does not make thread-safe: doing it per call from several threads, or
        while :meth:`close` closes the channel, can crash the process; so it happens once, under the lock."""
        with self._lock:
            stub = self._stubs.get((factory, address))
            if stub is None:
                stub = factory(self._channel_locked(address))
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
        return self._closed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
            self._stubs.clear()
        for chan in channels:
            chan.close()

    # -- leader guess ---------------------------------------------------------------------------

    @property
    def known_addresses(self) -> list[str]:
        return list(self._known)

    @property
    def leader(self) -> str | None:
        return self._leader

    def learn(self, address: str, *, is_leader: bool = False) -> None:
        """Remember a node address (and that it leads, if so)."""
        with self._lock:
            if address not in self._known:
                self._known.append(address)
            if is_leader:
                self._leader = address

    def forget_leader(self, address: str) -> None:
        """``address`` failed: stop sending to it first."""
        with self._lock:
            if self._leader == address:
                self._leader = None

    def next_address(self, after: str | None) -> str:
        """The known node after ``after`` in round-robin order."""
        with self._lock:
            if after not in self._known:
                return self._known[0]
            return self._known[(self._known.index(after) + 1) % len(self._known)]

    def read_address(self) -> str:
        """Where a read goes: the leader if it can be found quickly (so reads see the caller's
        writes), else any node (every node serves reads from its applied state)."""
        return self._leader or self.discover_leader() or self.next_address(None)

    def discover_leader(self) -> str | None:
        """Ask the known nodes who leads (NodeStatus, then ClusterStatus for an address)."""
        now = time.monotonic()
        if now < self._next_discovery:
            return self._leader
        self._next_discovery = now + _DISCOVERY_INTERVAL_S
        leader_id = ""
        for address in self.known_addresses:
            try:
                node = self.admin(address).NodeStatus(
                    admin_pb2.NodeStatusRequest(), timeout=_DISCOVERY_TIMEOUT_S
                )
            except grpc.RpcError:
                continue
            if node.role == "leader":
                self.learn(address, is_leader=True)
                return address
            leader_id = leader_id or node.leader_id
            if leader_id:
                located = self._locate(address, leader_id)
                if located:
                    return located
        return None

    def learn_members_soon(self, address: str) -> None:
        """Once per router, learn every node's address from ``address`` in the background, so a
        client bootstrapped with one address can still fail over when that node dies."""
        with self._lock:
            if self._members_asked or self._closed:
                return
            self._members_asked = True
        threading.Thread(target=self._learn_members, args=(address,), name="raftbroker-members",
                         daemon=True).start()

    def _learn_members(self, address: str) -> None:
        try:
            status = self.admin(address).ClusterStatus(
                admin_pb2.ClusterStatusRequest(), timeout=self.policy.timeout_s
            )
        except (grpc.RpcError, BrokerError, ValueError):  # best effort: unimplemented, unreachable or closed
            return
        for node in status.nodes:
            if node.grpc_address:
                self.learn(node.grpc_address)

    def _locate(self, address: str, leader_id: str) -> str | None:
        try:
            status = self.admin(address).ClusterStatus(
                admin_pb2.ClusterStatusRequest(), timeout=_DISCOVERY_TIMEOUT_S
            )
        except grpc.RpcError:
            return None
        for node in status.nodes:
            if node.grpc_address:
                self.learn(node.grpc_address, is_leader=node.id == leader_id)
        return self._leader

    # -- the retry loop -------------------------------------------------------------------------

    def call(self, fn: Call[T], *, write: bool, what: str) -> T:
        """``fn(address, timeout_s)`` on the leader, following redirects and retrying (see module doc)."""
        deadline = time.monotonic() + self.policy.retry_deadline_s
        backoff = Backoff(self.policy.backoff_initial_s, self.policy.backoff_max_s)
        address = (self._leader or self.next_address(None)) if write else self.read_address()
        unknown_outcome, redirects, tried = False, 0, []
        rotation = address  # where the round-robin goes on from (a hinted leader is not part of it)
        quorum = QuorumWatch(self.policy.no_quorum_grace_s)
        tls = self.tls_watch()
        while True:
            tried.append(address)
            try:
                result = fn(address, self.policy.timeout_s)
            except grpc.RpcError as err:
                if self._closed:  # its channel closed under it ("Channel closed!"): a write's outcome is not known
                    raise BrokerError("CANCELLED", f"{what}: the client was closed",
                                      after_unknown_outcome=write or unknown_outcome) from None
                outcome, hint = classify(err)
                if outcome is Outcome.FINAL:
                    raise error_from_rpc(err, after_unknown_outcome=unknown_outcome) from None
                unknown_outcome = unknown_outcome or (write and outcome is Outcome.UNKNOWN)
                if quorum.note(address, outcome, err) and quorum.covers(self.known_addresses):
                    raise quorum.lost(what, unknown_outcome) from None
                if self.disagree_on_tls(tls, address, err):
                    raise tls.error(what, unknown_outcome) from None
                pause = True
                if hint is not None:
                    redirects += 1
                    self.learn(hint, is_leader=True)
                    pause, address = redirects > self.policy.redirects_max, hint
                else:  # round-robin on from the last node tried unhinted: after a dead hint, the next one
                    redirects = 0
                    self.forget_leader(address)
                    address = rotation = self.next_address(rotation)
                delay = backoff.next_delay_s() if pause else 0.0
                if time.monotonic() + delay >= deadline:
                    raise self._gave_up(what, quorum.last_answer or err, tried, unknown_outcome) from None
                time.sleep(delay)
                continue
            if write:
                self.learn(address, is_leader=True)
            self.learn_members_soon(address)
            return result

    def admin_call(self, call: AdminCall[T]) -> T:
        """Run ``call`` (:mod:`broker.client.calls`) as :meth:`call` runs any call; its parsed answer."""
        response = self.call(lambda a, t: getattr(self.admin(a), call.method)(call.request, timeout=t),
                             write=call.write, what=call.what)
        return call.parse(response)

    def tls_watch(self) -> TlsWatch:
        """A :class:`TlsWatch` for one call's attempts (or one stream's reopenings)."""
        return TlsWatch(self._credentials is not None, self.answers_tls)

    def disagree_on_tls(self, watch: TlsWatch, address: str, err: grpc.RpcError) -> bool:
        """Note a failed attempt on ``address`` (probing it once if it may answer TLS); True once every
        known node disagrees with this client about TLS (raise ``watch.error``)."""
        if watch.wants_probe(address, err):
            self.answers_tls[address] = answers_tls(address)
        watch.note(address, err)
        return watch.covers(self.known_addresses)

    def _gave_up(self, what: str, err: grpc.RpcError, tried: list[str], unknown: bool) -> Unavailable:
        """Out of time: UNAVAILABLE with the reason and metadata of the last answer (none when no
        node answered)."""
        nodes = ", ".join(dict.fromkeys(tried))
        return gave_up(f"{what}: no leader answered within {self.policy.retry_deadline_s:g}s (tried {nodes}); "
                       f"last error: {rpc_code(err).name}: {rpc_details(err)}", err, after_unknown_outcome=unknown)


class TlsWatch:
    """Within one call: the nodes whose answers say that this client cannot talk to them the way it
    is set up, whichever node it tries: a plaintext client's connection closed by a node that
    answers TLS (see :func:`~broker.client.security.answers_tls`), a TLS client's handshake
    answered in plaintext, or a node certificate this client does not trust (its CA, or the name
    it checks). A cluster's nodes share one setting and one CA, so once every known node has
    answered so, the client's settings are wrong and no failover will help: the call ends at once,
    saying what to change, instead of retrying until its deadline as if every node were down."""

    _TRUST = {"certificate_verify_failed": "ca",  # a node certificate no CA of the client's signed
              "hostname verification check failed": "name"}  # or one without the name the client checks

    def __init__(self, tls: bool, answers_tls: dict[str, bool]) -> None:
        self._tls = tls
        self._answers_tls = answers_tls  # the router's, by address: whether it answered a TLS handshake
        self._disagree: dict[str, str] = {}  # address -> what it said: "tls", "plaintext", "ca" or "name"

    def wants_probe(self, address: str, err: grpc.RpcError) -> bool:
        """Whether ``err`` may be a TLS node closing this plaintext client's connection, and
        ``address`` was not probed yet (the caller probes it into the router's map)."""
        return not self._tls and address not in self._answers_tls and "socket closed" in rpc_details(err).lower()

    def note(self, address: str, err: grpc.RpcError) -> None:
        details = rpc_details(err).lower()
        if not self._tls:
            if "socket closed" in details and self._answers_tls.get(address, False):
                self._disagree[address] = "tls"
        elif "wrong_version_number" in details:
            self._disagree[address] = "plaintext"
        else:
            said = next((kind for sign, kind in self._TRUST.items() if sign in details), None)
            if said is not None:
                self._disagree[address] = said

    def covers(self, known: list[str]) -> bool:
        return bool(self._disagree) and all(a in self._disagree for a in known)

    def error(self, what: str, unknown: bool) -> Unavailable:
        """One sentence per kind of answer, each naming its nodes and its fix (a rotation gone
        wrong can leave one node untrusted and another without the checked name)."""
        by_kind: dict[str, list[str]] = {}
        for address, said in self._disagree.items():
            by_kind.setdefault(said, []).append(address)
        text = "; and ".join(self._advice(said, ", ".join(nodes)) for said, nodes in by_kind.items())
        return Unavailable("UNAVAILABLE", f"{what}: {text}", after_unknown_outcome=unknown)

    @staticmethod
    def _advice(said: str, nodes: str) -> str:
        if said == "tls":
            return (f"the nodes expect TLS ({nodes}), and this client connects without it: give it the cluster's "
                    f"client config (Client(client_config=PATH), the CLI's --client-config PATH, or "
                    f"${CLIENT_CONFIG_ENV}; 'raftbroker dev --secure' prints the path)")
        if said == "plaintext":
            return (f"this client connects with TLS (its client config), and the nodes answer without it ({nodes}): "
                    "connect without a client config, or check the addresses")
        if said == "ca":
            return (f"this client does not trust the nodes' certificates ({nodes}): no CA of its client config's "
                    "ca_file signed them; give it the CA that did")
        return (f"the nodes' certificates do not carry the name this client checks ({nodes}): set server_name in "
                "its client config to a name they carry, or connect by one")


class QuorumWatch:
    """Within one call: which nodes said "no quorum" and which could not be reached, since when.

    Any other answer (an election in progress, a redirect, a dropped call) means a majority may
    still be there, and starts the watch over."""

    def __init__(self, grace_s: float) -> None:
        self._grace_s = grace_s
        self._no_quorum: dict[str, str] = {}  # address -> its answer
        self._unreachable: set[str] = set()
        self._since: float | None = None
        self.last_answer: grpc.RpcError | None = None  # the last error a node answered (not a refused connection)

    def note(self, address: str, outcome: Outcome, err: grpc.RpcError) -> bool:
        """Record one failed attempt; True while every failure since the watch began fits a lost majority."""
        if outcome is not Outcome.NOT_SENT:
            self.last_answer = err
        if outcome is Outcome.NOT_SENT:
            self._unreachable.add(address)
            self._no_quorum.pop(address, None)
        elif outcome is Outcome.NO_QUORUM:
            self._no_quorum[address] = rpc_details(err)
            self._unreachable.discard(address)
            if self._since is None:
                self._since = time.monotonic()
        else:
            self._no_quorum.clear()
            self._unreachable.clear()
            self._since = None
        return self._since is not None

    def covers(self, known: list[str]) -> bool:
        """Every known node has said "no quorum" or been unreachable, for at least the grace time."""
        assert self._since is not None
        heard = self._unreachable | set(self._no_quorum)
        return all(a in heard for a in known) and time.monotonic() - self._since >= self._grace_s

    def lost(self, what: str, unknown: bool) -> Unavailable:
        answered = ", ".join(sorted(self._no_quorum))
        unreachable = ", ".join(sorted(self._unreachable)) or "none"
        answer = next(iter(self._no_quorum.values()))
        answer = answer[len("no quorum: "):] if answer.lower().startswith("no quorum: ") else answer  # said once
        return Unavailable(
            "UNAVAILABLE",
            f"{what}: the cluster has no quorum: {answer} (said by {answered}; unreachable: {unreachable})",
            after_unknown_outcome=unknown,
            reason=Reason.NO_QUORUM,
        )
