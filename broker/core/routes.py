"""Routes (SPEC §3.4): replicated route definitions and per-source-partition cursors.

A route copies the matching records of a source topic into a target topic of this cluster or of
a remote one. Its definition and its cursors are replicated state, applied here: the cursor of a
source partition is the offset below which every record was copied (or filtered out), so a new
leader's router resumes from it. Cursors only move forward, and only after the copies below them
are committed (``broker.leader.router``).

Layout in ``Column.META`` (beside the topic keys of the state machine):
``route/<name>`` -> ``RouteMeta``; ``rcur/<name>\\x00`` + ``>I`` partition -> ``>IQ`` (source topic
id, next offset); ``rstat/<name>`` -> ``>QQQ`` (records copied, skipped, lost: the totals of the
advances that carried them, from command format 5); ``next_route_id`` -> ``>Q``. A cursor of
another source incarnation than the topic's current one counts as "from the start" (the topic was
dropped and re-created).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from broker.core.applied import CacheChanges, Rejected
from broker.core.errors import FailedPrecondition, RouteExists, RouteNotFound
from broker.core.state_machine import BrokerStateMachine
from broker.storage import Batch, Column
from broker.v1 import internal_pb2, routes_internal_pb2

_ROUTE = b"route/"
_CURSOR = b"rcur/"
_NEXT_ROUTE_ID = b"next_route_id"
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_CURSOR_VALUE = struct.Struct(">IQ")
_STATS = b"rstat/"
_STATS_VALUE = struct.Struct(">QQQ")


def find_cycle(routes: Iterable[internal_pb2.RouteConfig], new: internal_pb2.RouteConfig) -> list[str] | None:
    """The topic path a new local route would close into a cycle (``[a, b, a]``), or None.
    Routes to remote clusters never form a cycle here (their echo is prevented by origin)."""
    if new.target_cluster:
        return None
    edges: dict[str, list[str]] = {}
    for config in routes:
        if not config.target_cluster:
            edges.setdefault(config.source, []).append(config.target)
    # a path target ->* source plus the new edge source -> target is a cycle
    stack: list[list[str]] = [[new.target]]
    seen: set[str] = set()
    while stack:
        path = stack.pop()
        here = path[-1]
        if here == new.source:
            return [new.source, *path]
        if here in seen:
            continue
        seen.add(here)
        stack.extend([*path, nxt] for nxt in sorted(edges.get(here, ()), reverse=True))
    return None


def cycle_error(name: str, path: Sequence[str]) -> FailedPrecondition:
    return FailedPrecondition(f"route {name!r} would close a cycle of routes in this cluster: "
                              f"{' -> '.join(path)} (records would be copied forever)")


def _route_key(name: str) -> bytes:
    return _ROUTE + name.encode()


def _cursor_prefix(name: str) -> bytes:
    return _CURSOR + name.encode() + b"\x00"


def _stats_key(name: str) -> bytes:
    return _STATS + name.encode()


class RouteTable:
    """Route definitions and cursors in the replicated store; registers its commands on construction.

    Reads go to the store each time (no cache), so a restored snapshot is seen at once."""

    def __init__(self, state: BrokerStateMachine) -> None:
        self._state = state
        state.register("create_route", self._apply_create)
        state.register("delete_route", self._apply_delete)
        state.register("advance_route", self._apply_advance)

    # -- reads ---------------------------------------------------------------------------------
    def get(self, name: str) -> routes_internal_pb2.RouteMeta | None:
        raw = self._state.store.get(Column.META, _route_key(name))
        return routes_internal_pb2.RouteMeta.FromString(raw) if raw is not None else None

    def all(self) -> list[routes_internal_pb2.RouteMeta]:
        """Every route, by name."""
        return [routes_internal_pb2.RouteMeta.FromString(v)
                for _, v in self._state.store.scan(Column.META, _ROUTE, _ROUTE[:-1] + b"0")]

    def cursors(self, name: str) -> dict[int, tuple[int, int]]:
        """partition -> (source topic id, next offset) as stored."""
        prefix = _cursor_prefix(name)
        out: dict[int, tuple[int, int]] = {}
        for key, value in self._state.store.scan(Column.META, prefix, prefix[:-1] + b"\x01"):
            out[_U32.unpack(key[len(prefix):])[0]] = _CURSOR_VALUE.unpack(value)
        return out

    def totals(self, name: str) -> tuple[int, int, int] | None:
        """(copied, skipped, lost) as the route's advances carried them (replicated, so the same on
        every node and across leaders); None before any advance carried them (command format 5)."""
        raw = self._state.store.get(Column.META, _stats_key(name))
        return None if raw is None else _STATS_VALUE.unpack(raw)

    def positions(self, meta: routes_internal_pb2.RouteMeta) -> list[tuple[int, int, int]]:
        """(partition, next offset, end offset) per source partition, as this node has applied
        them; empty when the source topic does not exist."""
        source = self._state.topic(meta.config.source)
        if source is None:
            return []
        cursors = self.cursors(meta.config.name)
        out = []
        for p in range(source.config.partitions):
            st = self._state.partition(source.topic_id, p)
            tid, offset = cursors.get(p, (0, 0))
            start = offset if tid == source.topic_id else 0
            out.append((p, max(start, st.start_offset), st.end_offset))
        return out

    # -- apply ---------------------------------------------------------------------------------
    def _apply_create(self, cmd: routes_internal_pb2.CreateRouteCommand, batch: Batch,
                      changes: CacheChanges) -> object:
        config = cmd.config
        if self.get(config.name) is not None:
            return Rejected(RouteExists(config.name))
        cycle = find_cycle((m.config for m in self.all()), config)
        if cycle is not None:
            return Rejected(cycle_error(config.name, cycle))
        raw = self._state.store.get(Column.META, _NEXT_ROUTE_ID)
        route_id = _U64.unpack(raw)[0] if raw else 1
        meta = routes_internal_pb2.RouteMeta(config=config, route_id=route_id, created_ms=cmd.now_ms)
        batch.put(Column.META, _route_key(config.name), meta.SerializeToString())
        batch.put(Column.META, _NEXT_ROUTE_ID, _U64.pack(route_id + 1))
        return meta

    def _apply_delete(self, cmd: routes_internal_pb2.DeleteRouteCommand, batch: Batch,
                      changes: CacheChanges) -> object:
        meta = self.get(cmd.name)
        if meta is None or (cmd.route_id and meta.route_id != cmd.route_id):
            return Rejected(RouteNotFound(cmd.name))
        batch.delete(Column.META, _route_key(cmd.name))
        batch.delete(Column.META, _stats_key(cmd.name))
        prefix = _cursor_prefix(cmd.name)
        batch.delete_range(Column.META, prefix, prefix[:-1] + b"\x01")
        return meta

    def _apply_advance(self, cmd: routes_internal_pb2.AdvanceRouteCommand, batch: Batch,
                       changes: CacheChanges) -> object:
        meta = self.get(cmd.name)
        if meta is None or meta.route_id != cmd.route_id:
            return Rejected(RouteNotFound(cmd.name))
        stored = self.cursors(cmd.name)
        prefix = _cursor_prefix(cmd.name)
        stale = False
        for partition, offset in zip(cmd.partitions, cmd.next_offsets, strict=True):
            tid, old = stored.get(partition, (0, 0))
            if cmd.source_topic_id < tid or (cmd.source_topic_id == tid and offset <= old):
                stale = True
                continue  # never backwards, never to an older incarnation
            batch.put(Column.META, prefix + _U32.pack(partition), _CURSOR_VALUE.pack(cmd.source_topic_id, offset))
        if (cmd.copied or cmd.skipped or cmd.lost) and not stale:  # a stale advance's records were counted
            copied, skipped, lost = self.totals(cmd.name) or (0, 0, 0)
            batch.put(Column.META, _stats_key(cmd.name),
                      _STATS_VALUE.pack(copied + cmd.copied, skipped + cmd.skipped, lost + cmd.lost))
        return None
