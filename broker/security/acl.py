"""Access control: which principal may do what on which topic and group.

An ACL file (TOML, re-read when it changes) is a list of grants; anything not granted is denied::

    [[allow]]
    principals = ["billing", "svc-*"]      # patterns; "*" is everyone authenticated
    permissions = ["publish", "consume"]
    topics = ["orders", "orders.*"]        # patterns; required for topic permissions
    groups = ["billing-*"]                 # optional, default ["*"]: groups a group call may name

    [[allow]]
    principals = ["admin"]
    permissions = ["cluster-admin"]        # everything, on every topic and group

Patterns are exact names, or globs where ``*`` matches any run of characters (so ``orders.*`` is
a prefix). Permissions: ``publish``, ``consume`` (read a topic; with a group, be a member of it),
``admin`` (create, alter, drop, clear, prune topics; manage groups and dead letters),
``mirror`` (append copies through the Mirror service, which keeps their producer and origin),
``cluster-admin`` (membership, routes, mirroring and every topic permission).
A call on a topic with a group needs one grant whose topics match the topic and whose groups
match the group.
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.security.watched import WatchedFile

PUBLISH = "publish"
CONSUME = "consume"
ADMIN = "admin"
MIRROR = "mirror"
CLUSTER_ADMIN = "cluster-admin"
PERMISSIONS = (PUBLISH, CONSUME, ADMIN, MIRROR, CLUSTER_ADMIN)
TOPIC_PERMISSIONS = (PUBLISH, CONSUME, ADMIN)
GRANTS_MAX = 10_000


def _match(patterns: Sequence[str], name: str) -> bool:
    # fnmatchcase with only "*" special: escape "[" and "?" so names containing them stay literal
    return any(fnmatch.fnmatchcase(name, p.replace("[", "[[]").replace("?", "[?]")) for p in patterns)


@dataclass(frozen=True)
class Grant:
    principals: tuple[str, ...]
    permissions: frozenset[str]
    topics: tuple[str, ...]
    groups: tuple[str, ...]

    def allows(self, principal: str, permission: str, topic: str, group: str) -> bool:
        if not _match(self.principals, principal):
            return False
        if CLUSTER_ADMIN in self.permissions:
            return True
        if permission not in self.permissions:
            return False
        if permission in TOPIC_PERMISSIONS:
            return _match(self.topics, topic) and (not group or _match(self.groups, group))
        return True  # mirror: not scoped to topics


def _patterns(item: dict[str, object], key: str, where: str, default: tuple[str, ...] | None) -> tuple[str, ...]:
    value = item.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"{where}: {key} is required")
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where}: {key} must be a list of non-empty strings")
    return tuple(value)


def parse_acl(text: str) -> list[Grant]:
    """The grants of an ACL file; ``ValueError`` naming the grant for anything malformed."""
    data = tomllib.loads(text)
    unknown = set(data) - {"allow"}
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}: expected [[allow]] tables")
    items = data.get("allow", [])
    if len(items) > GRANTS_MAX:
        raise ValueError(f"{len(items)} grants, over the limit of {GRANTS_MAX}")
    grants: list[Grant] = []
    for i, item in enumerate(items):
        where = f"allow {i + 1}"
        extra = set(item) - {"principals", "permissions", "topics", "groups"}
        if extra:
            raise ValueError(f"{where}: unknown key(s) {sorted(extra)}")
        perms = _patterns(item, "permissions", where, None)
        bad = [p for p in perms if p not in PERMISSIONS]
        if bad:
            raise ValueError(f"{where}: unknown permission(s) {bad}; known: {list(PERMISSIONS)}")
        needs_topics = any(p in TOPIC_PERMISSIONS for p in perms) and CLUSTER_ADMIN not in perms
        topics = _patterns(item, "topics", where, None if needs_topics else ())
        grants.append(Grant(_patterns(item, "principals", where, None), frozenset(perms), topics,
                            _patterns(item, "groups", where, ("*",))))
    return grants


class Acl:
    """The grants of the ACL file (re-read when it changes)."""

    def __init__(self, path: Path) -> None:
        self._file = WatchedFile(path, parse_acl)

    def allows(self, principal: str, permission: str, topic: str = "", group: str = "") -> bool:
        return any(g.allows(principal, permission, topic, group) for g in self._file.get())
