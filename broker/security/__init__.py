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

from contextvars import ContextVar

_PRINCIPAL: ContextVar[str] = ContextVar("raftbroker_principal", default="")

# metadata the HTTP gateway sends with every call it makes for an HTTP request: such a call is never
# the principal of the client certificate (the gateway presents its node's own), only of its token
VIA_GATEWAY_METADATA = "x-raftbroker-via-gateway"


def current_principal() -> str:
    """The authenticated principal of the call being served ("" when authentication is off)."""
    return _PRINCIPAL.get()


def set_principal(principal: str) -> None:
    """Set by the interceptor around the servicer of one call (its thread or task)."""
    _PRINCIPAL.set(principal)
