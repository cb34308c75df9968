"""The one gRPC server interceptor that authenticates and authorises every call.

Every method is looked up in :data:`METHOD_RULES` (full method name → :class:`Rule`); a method
missing from the table needs ``cluster-admin`` (new methods are closed until classified).
Authentication: ``authorization: Bearer TOKEN`` metadata, checked against the tokens file; with
``principal_from_cert``, a call without a token is the principal of its verified client
certificate (its subject's common name). A missing, unknown or expired token is UNAUTHENTICATED.
Authorisation: the rule's permission on the request's topic (``topic``, ``name`` or
``config.name`` field) and group (``group``), checked against the ACL; a refusal is
PERMISSION_DENIED naming the permission and the resource. For ``PublishStream`` every request
of the stream is checked; a refused one ends the stream (after the earlier ones are answered)
with PERMISSION_DENIED. A ``Subscribe`` stream is authorised again before each answer, so a grant
revoked ends it too. A stream's credentials are authenticated again with each request
(``PublishStream``) or answer (``Subscribe``): once its token no longer yields the principal the
stream was opened as (removed, expired, given to another principal), the stream ends with
UNAUTHENTICATED and the reason ``STREAM_REAUTHENTICATE`` before that step is done. The SDKs then
open a new stream once, with the token they hold now: a client whose token was rotated (its
``token_file`` rewritten) goes on, and one whose token was revoked is refused as it opens.
The principal is set for the servicer (:func:`broker.security.current_principal`), which stamps it
as each published record's producer. Refusals and every admin action are audited.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from broker.protowire import Received
from broker.reasons import Reason
from broker.security import VIA_GATEWAY_METADATA, set_principal, set_stream_check
from broker.security.acl import ADMIN, CLUSTER_ADMIN, CONSUME, MIRROR, PUBLISH, TOPIC_PERMISSIONS, Acl
from broker.security.audit import audit
from broker.security.tokens import AuthenticationError, TokenStore

PUBLIC = "public"  # no credential needed: health probes, NodeStatus and ApplyDigest (nodes ask each other)
AUTHENTICATED = "authenticated"  # any authenticated principal


@dataclass(frozen=True)
class Rule:
    permission: str  # PUBLIC, AUTHENTICATED or an ACL permission
    audited: bool = False  # an admin action: audited whatever its result


_TOPIC_READ = Rule(CONSUME)
_TOPIC_ADMIN = Rule(ADMIN, audited=True)
_CLUSTER = Rule(CLUSTER_ADMIN, audited=True)

METHOD_RULES: dict[str, Rule] = {
    **{f"/broker.v1.Broker/{m}": Rule(PUBLISH) for m in ("Publish", "PublishStream")},
    **{f"/broker.v1.Broker/{m}": _TOPIC_READ for m in (
        "Subscribe", "Ack", "Nack", "Commit", "JoinGroup", "Heartbeat", "Extend", "Discard", "LeaveGroup")},
    **{f"/broker.v1.Admin/{m}": _TOPIC_READ for m in (
        "DescribeTopic", "GetWatermarks", "ListGroups", "DescribeGroup", "GroupLag", "ListDeadLetters")},
    **{f"/broker.v1.Admin/{m}": _TOPIC_ADMIN for m in (
        "CreateTopic", "AlterTopic", "DropTopic", "ClearTopic", "Prune", "ResetWatermark", "CreateGroup",
        "DeleteGroup", "SeekGroup", "PauseGroups", "ResumeGroups", "RetryDeadLetters", "PurgeDeadLetters",
        "MarkGroup")},
    **{f"/broker.v1.Admin/{m}": _CLUSTER for m in (
        "AddNode", "RemoveNode", "CreateRoute", "ListRoutes", "DeleteRoute")},
    "/broker.v1.Admin/ListTopics": Rule(AUTHENTICATED),
    "/broker.v1.Admin/ClusterStatus": Rule(AUTHENTICATED),
    "/broker.v1.Admin/NodeStatus": Rule(PUBLIC),
    "/broker.v1.Admin/ApplyDigest": Rule(PUBLIC),  # nodes ask each other for it (VerifyReplicas); a CRC32C
    "/broker.v1.Admin/VerifyReplicas": Rule(AUTHENTICATED),
    "/broker.v1.Mirror/Identify": Rule(MIRROR),
    "/broker.v1.Mirror/Append": Rule(MIRROR, audited=True),
    "/grpc.health.v1.Health/Check": Rule(PUBLIC),
    "/grpc.health.v1.Health/Watch": Rule(PUBLIC),
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": Rule(AUTHENTICATED),
}
DEFAULT_RULE = _CLUSTER
# methods whose empty ``group`` means every group of the topic: authorised as the group "*", which
# only a grant whose groups match every group (``"*"``) allows (no group name contains "*")
EVERY_GROUP_METHODS = frozenset(f"/broker.v1.Admin/{m}" for m in ("PauseGroups", "ResumeGroups"))
EVERY_GROUP = "*"


class Denied(Exception):
    """The call is refused: ``code`` and a message naming what is missing."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: Reason | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason  # put on the wire as the status's ErrorInfo when set (see trailers)

    def trailers(self) -> tuple[tuple[str, str | bytes], ...]:
        """The trailing metadata of the status that ends a call with this refusal."""
        if self.reason is None:
            return ()
        from broker.services.errors import details_trailer  # the one encoder of status details

        return (details_trailer(self.code, str(self), self.reason, {}),)


def request_resource(request: Any) -> tuple[str, str]:
    """(topic, group) a request names ("" where it names none)."""
    if isinstance(request, Received):  # a request kept with its bytes (Publish)
        request = request.message
    topic = ""
    fields = {f.name for f in request.DESCRIPTOR.fields} if hasattr(request, "DESCRIPTOR") else set()
    if "topic" in fields:
        topic = request.topic
    elif "name" in fields:
        topic = request.name
    elif "config" in fields and hasattr(request.config, "name"):
        topic = request.config.name
    group = request.group if "group" in fields else ""
    return topic, group


def call_resource(method: str, request: Any) -> tuple[str, str]:
    """(topic, group) a call of ``method`` acts on: :func:`request_resource`, with :data:`EVERY_GROUP`
    for a call of :data:`EVERY_GROUP_METHODS` that names no group."""
    topic, group = request_resource(request) if request is not None else ("", "")
    if not group and method in EVERY_GROUP_METHODS:
        group = EVERY_GROUP
    return topic, group


def _describe(permission: str, topic: str, group: str) -> str:
    if permission in (CLUSTER_ADMIN, MIRROR, AUTHENTICATED):
        return "cluster"
    return f"group:{topic}/{group}" if group else f"topic:{topic}"


def _via_gateway(context: grpc.ServicerContext) -> bool:
    return any(key == VIA_GATEWAY_METADATA for key, _ in context.invocation_metadata() or ())


class Guard:
    """Authentication and authorisation of calls (the part of the interceptor that knows no gRPC plumbing)."""

    def __init__(self, tokens: TokenStore | None, acl: Acl, principal_from_cert: bool = False) -> None:
        self._tokens = tokens
        self._acl = acl
        self._from_cert = principal_from_cert

    def authenticate(self, context: grpc.ServicerContext) -> str:
        token = self.bearer_token(context)
        if token:
            return self._principal_of(token)
        if self._from_cert and not _via_gateway(context):  # the gateway's certificate is its node's, not its caller's
            names = context.auth_context().get("x509_common_name") or []
            if names:
                return bytes(names[0]).decode()
        raise Denied(grpc.StatusCode.UNAUTHENTICATED, "missing credentials: send 'authorization: Bearer TOKEN'")

    @staticmethod
    def bearer_token(context: grpc.ServicerContext) -> str:
        """The call's bearer token ("" without one)."""
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == "authorization":
                scheme, _, rest = str(value).partition(" ")
                if scheme.lower() != "bearer" or not rest.strip():
                    raise Denied(grpc.StatusCode.UNAUTHENTICATED, "authorization metadata must be 'Bearer TOKEN'")
                token = rest.strip()
        return token

    def _principal_of(self, token: str) -> str:
        if self._tokens is None:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED, "this node accepts no bearer tokens")
        try:
            return self._tokens.authenticate(token)
        except AuthenticationError as exc:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None

    def still(self, token: str, principal: str) -> None:
        """Raise :class:`Denied` (UNAUTHENTICATED, ``STREAM_REAUTHENTICATE``) when ``token``, the bearer
        token an open stream was opened with, no longer authenticates ``principal``. A stream opened
        without a token (its client certificate's principal: fixed for the connection) always may
        go on. Takes the token, not the call's context, so any thread may call it."""
        if not token:
            return
        try:
            now = self._principal_of(token)
        except Denied as denied:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED,
                         f"this stream's credentials no longer authenticate principal {principal!r} ({denied}): "
                         "open a new stream with a current token", Reason.STREAM_REAUTHENTICATE) from None
        if now != principal:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED,
                         f"this stream's token is now principal {now!r}'s, not {principal!r}'s: open a new stream",
                         Reason.STREAM_REAUTHENTICATE)

    def authorise(self, principal: str, method: str, rule: Rule, request: Any) -> str:
        """The resource description; :class:`Denied` when ``principal`` lacks the rule's permission."""
        topic, group = call_resource(method, request)
        resource = _describe(rule.permission, topic, group)
        if rule.permission == AUTHENTICATED:
            return resource
        if not self._acl.allows(principal, rule.permission, topic, group):
            raise Denied(grpc.StatusCode.PERMISSION_DENIED,
                         f"principal {principal!r} lacks the {rule.permission!r} permission on {resource}")
        return resource


Behavior = Callable[..., Any]


def _code_name(context: Any) -> str:
    """The status code a failed call ended with, as far as the context tells."""
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - not every context kind can tell
        return "error"
    return code.name if isinstance(code, grpc.StatusCode) else str(code or "error")


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Wraps each method handler with :class:`Guard` checks (sync handlers stay sync, async stay async)."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        rule = METHOD_RULES.get(method, DEFAULT_RULE)
        if handler is None or rule.permission == PUBLIC:
            return handler
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(handler.unary_unary, method, rule))
        if handler.unary_stream is not None:
            if not inspect.isasyncgenfunction(handler.unary_stream):  # a sync servicer (e.g. reflection)
                return handler._replace(unary_stream=self._sync_stream(handler.unary_stream, method, rule, False))
            return handler._replace(unary_stream=self._unary_stream(handler.unary_stream, method, rule))
        if handler.stream_stream is not None:
            if not inspect.isasyncgenfunction(handler.stream_stream):
                return handler._replace(stream_stream=self._sync_stream(handler.stream_stream, method, rule, True))
            return handler._replace(stream_stream=self._stream_stream(handler.stream_stream, method, rule))
        return handler._replace(stream_unary=self._stream_unary(handler.stream_unary, method, rule))

    def _check(self, context: Any, method: str, rule: Rule, request: Any) -> tuple[str, str]:
        principal = ""
        try:
            principal = self._guard.authenticate(context)
            resource = self._guard.authorise(principal, method, rule, request)
        except Denied as denied:
            topic, group = call_resource(method, request)
            kind = "unauthenticated" if denied.code == grpc.StatusCode.UNAUTHENTICATED else "denied"
            audit(principal, method, _describe(rule.permission, topic, group), f"{kind}: {denied}", context.peer())
            raise
        return principal, resource

    def _unary(self, behavior: Behavior, method: str, rule: Rule) -> Behavior:
        if inspect.iscoroutinefunction(behavior):  # an async servicer (Publish): stays async
            return self._unary_async(behavior, method, rule)
        guard = self

        def wrapper(request: Any, context: Any) -> Any:
            try:
                principal, resource = guard._check(context, method, rule, request)
            except Denied as denied:
                context.abort(denied.code, str(denied))
                raise AssertionError("unreachable") from None
            set_principal(principal)
            if not rule.audited:
                return behavior(request, context)
            try:
                response = behavior(request, context)
            except BaseException:
                audit(principal, method, resource, f"failed: {_code_name(context)}", context.peer())
                raise
            audit(principal, method, resource, "ok", context.peer())
            return response

        return wrapper

    def _unary_async(self, behavior: Behavior, method: str, rule: Rule) -> Behavior:
        guard = self

        async def wrapper(request: Any, context: Any) -> Any:
            try:
                principal, resource = guard._check(context, method, rule, request)
            except Denied as denied:
                await context.abort(denied.code, str(denied))
                raise AssertionError("unreachable") from None
            set_principal(principal)  # in this call's task: the servicer reads it there
            if not rule.audited:
                return await behavior(request, context)
            try:
                response = await behavior(request, context)
            except BaseException:
                audit(principal, method, resource, f"failed: {_code_name(context)}", context.peer())
                raise
            audit(principal, method, resource, "ok", context.peer())
            return response

        return wrapper

    def _sync_stream(self, behavior: Behavior, method: str, rule: Rule, request_streaming: bool) -> Behavior:
        """A response-streaming servicer written as a sync generator (run on the call pool)."""
        guard = self
        per_request = request_streaming and rule.permission in TOPIC_PERMISSIONS

        def wrapper(request: Any, context: Any) -> Iterator[Any]:
            first = None if request_streaming else request
            try:
                principal, _ = guard._check(context, method, Rule(AUTHENTICATED) if per_request else rule, first)
            except Denied as denied:
                context.abort(denied.code, str(denied))
                raise AssertionError("unreachable") from None
            set_principal(principal)
            token = guard._guard.bearer_token(context)  # what the stream authenticated with (checked again)
            refused: list[Denied] = []

            def checked(requests: Iterator[Any]) -> Iterator[Any]:
                for item in requests:
                    try:
                        guard._guard.still(token, principal)
                        guard._guard.authorise(principal, method, rule, item)
                    except Denied as denied:
                        audit(principal, method, _describe(rule.permission, *request_resource(item)),
                              f"denied: {denied}", context.peer())
                        refused.append(denied)
                        return
                    yield item

            yield from behavior(checked(request) if per_request else request, context)
            if refused:
                context.set_trailing_metadata(refused[0].trailers())
                context.abort(refused[0].code, str(refused[0]))

        return wrapper

    def _unary_stream(self, behavior: Behavior, method: str, rule: Rule) -> Behavior:
        guard = self

        async def wrapper(request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                principal, _ = guard._check(context, method, rule, request)
            except Denied as denied:
                await context.abort(denied.code, str(denied))
            set_principal(principal)
            token = guard._guard.bearer_token(context)  # what the stream authenticated with (checked again)
            refused: list[Denied] = []
            lock = threading.Lock()

            def allowed() -> bool:
                """Whether the stream may go on: its credentials still authenticate its principal,
                and the principal still holds the grant (a token removed or a grant revoked ends an
                open stream). Called before each answer, and by the servicer before it leases
                records for the stream (:func:`broker.security.stream_check`: a group stream ends
                before its next pick, so no lease is stranded in an answer never sent); from any thread."""
                with lock:
                    if refused:
                        return False
                    try:
                        guard._guard.still(token, principal)
                        guard._guard.authorise(principal, method, rule, request)
                    except Denied as denied:
                        kind = "unauthenticated" if denied.code == grpc.StatusCode.UNAUTHENTICATED else "denied"
                        audit(principal, method, _describe(rule.permission, *call_resource(method, request)),
                              f"{kind}: {denied}", context.peer())
                        refused.append(denied)
                        return False
                    return True

            set_stream_check(allowed)
            async with contextlib.aclosing(behavior(request, context)) as items:
                async for item in items:
                    if not allowed():
                        break
                    yield item
            if refused:
                context.set_trailing_metadata(refused[0].trailers())
                await context.abort(refused[0].code, str(refused[0]))

        return wrapper

    def _checked_requests(self, requests: AsyncIterator[Any], context: Any, method: str, rule: Rule,
                          principal: str, refused: list[Denied]) -> AsyncIterator[Any]:
        token = self._guard.bearer_token(context)  # what the stream authenticated with (checked again)

        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                try:
                    self._guard.still(token, principal)
                    self._guard.authorise(principal, method, rule, request)
                except Denied as denied:
                    topic, group = request_resource(request)
                    kind = "unauthenticated" if denied.code == grpc.StatusCode.UNAUTHENTICATED else "denied"
                    audit(principal, method, _describe(rule.permission, topic, group), f"{kind}: {denied}",
                          context.peer())
                    refused.append(denied)
                    return
                yield request
        return checked()

    def _stream_stream(self, behavior: Behavior, method: str, rule: Rule) -> Behavior:
        guard = self
        per_request = rule.permission in TOPIC_PERMISSIONS  # each request names its own topic

        async def wrapper(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            try:
                principal, _ = guard._check(context, method, Rule(AUTHENTICATED) if per_request else rule, None)
            except Denied as denied:
                await context.abort(denied.code, str(denied))
            set_principal(principal)
            refused: list[Denied] = []
            if per_request:
                requests = guard._checked_requests(requests, context, method, rule, principal, refused)
            async for item in behavior(requests, context):
                yield item
            if refused:
                context.set_trailing_metadata(refused[0].trailers())
                await context.abort(refused[0].code, str(refused[0]))

        return wrapper

    def _stream_unary(self, behavior: Behavior, method: str, rule: Rule) -> Behavior:
        guard = self

        async def wrapper(requests: AsyncIterator[Any], context: Any) -> Any:
            try:
                principal, _ = guard._check(context, method, rule, None)
            except Denied as denied:
                await context.abort(denied.code, str(denied))
            set_principal(principal)
            return await behavior(requests, context)

        return wrapper
