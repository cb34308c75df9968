"""Security of the gRPC API (SPEC §8): TLS, bearer tokens mapped to principals, per-topic ACLs, audit.

- :mod:`broker.security.tls`: server credentials that reload certificates when their files change;
- :mod:`broker.security.tokens`: a file of hashed tokens → principals, reloaded when it changes;
- :mod:`broker.security.acl`: rules granting permissions on topics and groups, reloaded likewise;
- :mod:`broker.security.audit`: one JSON line per admin action and per refused request;
- :mod:`broker.security.interceptor`: the one server interceptor that authenticates and
  authorises every call from a table of method → (permission, resource), so servicers carry no
  security logic; the principal reaches the publish path through :func:`current_principal`;
- :mod:`broker.security.devcerts`: the CA, certificates, token and client config of
  ``raftbroker dev --secure``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

_PRINCIPAL: ContextVar[str] = ContextVar("raftbroker_principal", default="")
_STREAM_CHECK: ContextVar[Callable[[], bool] | None] = ContextVar("raftbroker_stream_check", default=None)

# metadata the HTTP gateway sends with every call it makes for an HTTP request: such a call is never
# the principal of the client certificate (the gateway presents its node's own), only of its token
VIA_GATEWAY_METADATA = "x-raftbroker-via-gateway"


def current_principal() -> str:
    """The authenticated principal of the call being served ("" when authentication is off)."""
    return _PRINCIPAL.get()


def set_principal(principal: str) -> None:
    """Set by the interceptor around the servicer of one call (its thread or task)."""
    _PRINCIPAL.set(principal)


def stream_check() -> Callable[[], bool] | None:
    """For the response stream being served: a callable that says whether it may go on (False once
    its token no longer authenticates its principal or a grant was revoked; the interceptor then
    ends the stream with that status), callable from any thread; None when security is off. A
    servicer calls it before it takes anything for the stream (a group's leases), so that nothing
    is taken for an answer that will not be sent."""
    return _STREAM_CHECK.get()


def set_stream_check(check: Callable[[], bool]) -> None:
    """Set by the interceptor around the servicer of one response stream (its task)."""
    _STREAM_CHECK.set(check)
