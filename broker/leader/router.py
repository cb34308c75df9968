"""The router: on the leader, copies every route's matching records into its target (SPEC §3.4).

One daemon thread per node (``router``); it works only while its node leads. While routes exist,
every apply that changes the state wakes it; without any, applies do not (a route created on this
node wakes it through :meth:`RouteRunner.wake`, any other within ``WAKE_S``). A pass reads each route's
source partitions from the replicated cursor on (at most ``batch_records`` records per route),
evaluates the op list, the CEL filter and the partition-key expression on every record, appends
the copies to the target in source order (the local log through :class:`TrustedAppender`, or a
remote cluster through a :class:`RemoteCluster`), and only then advances the replicated cursor.
Each copy carries an idempotency key derived from (cluster, route, source incarnation, partition,
offset), so copies re-sent by a new leader after a failover are stored once (within the target's
dedup window). A remote route never copies a record whose origin is the target cluster, nor one
that the target cluster sent here (its ``raftbroker-via`` header, which every copy to another
cluster carries: :mod:`.route_copies`): mirrored clusters never echo, a third cluster's records
included.

Lanes: the router thread runs the local routes; the routes to each remote cluster (one lane per
target address list) run on a thread of their own (``router-<addresses>``), because a call to
another cluster can block for seconds (connecting, leader discovery, the SDK's retry deadline) and
would otherwise hold up every other route. A lane runs the very same pass over its routes only, so
each route is worked by one thread at a time: its copies go out in source order and its cursor moves
only after its target acknowledged them, as before. The router thread owns the lanes: it starts one
when a remote route appears while this node leads, and retires it when no route targets those
addresses any more, when leadership is lost, and at :meth:`RouteRunner.stop` (which joins them all).
Retiring never waits on the lane: it closes the lane's connection, which cancels a call in flight
(the copies of that call are re-sent later under the same idempotency keys), and a lane for the
same addresses is started again only once the retired one has ended, never beside it.

Errors never stall other routes: a route whose target is unreachable, missing or full is retried
with a capped backoff and reports ``last_error``; a record its target refuses for good (schema,
dedup fields) is skipped, counted and logged, and the route goes on. A route whose expressions this
version refuses (e.g. stored before the checks of ``cel_check`` existed), that break their
evaluation budget, or whose filter yields a non-boolean, is paused on this leader: it is not
evaluated again, and reports ``last_error`` ("paused: ...") until it is deleted and re-created.
Expressions are evaluated in evaluator processes (``cel_sandbox``), never under this process's GIL.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from broker.core import record_log
from broker.core.applied import Rejected
from broker.core.errors import InvalidArgument, ResourceExhausted
from broker.core.formats import ROUTE_TOTALS_FORMAT
from broker.core.routes import RouteTable
from broker.core.state_machine import BrokerStateMachine
from broker.leader.cel_sandbox import ExpressionBudgetExceeded
from broker.leader.filters import RecordExpression, RecordFilter
from broker.leader.route_copies import VIA_HEADER, Copy, idempotency_key, origin_cluster, sent_via
from broker.leader.route_lanes import Connections, Lane, RemoteCluster
from broker.leader.routed_append import TrustedAppender
from broker.leader.submitter import CommandSubmitter
from broker.reasons import refused_records
from broker.v1 import internal_pb2, routes_internal_pb2

log = logging.getLogger(__name__)

BATCH_RECORDS = 500
BATCH_BYTES = 1 << 20
WAKE_S = 1.0
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 5.0


@dataclass
class RouteStats:
    """What this node's router did for one route while it led (not replicated)."""

    route_id: int
    copied: int = 0
    skipped: int = 0  # everything not copied, ``lost`` included
    lost: int = 0  # not copied and should have been: deleted before routed, unreadable, refused by the target
    last_error: str = ""
    retry_at: float = 0.0
    backoff_s: float = 0.0
    paused: bool = False  # an expression was refused or broke its budget: never evaluated again


class _ExpressionRefused(Exception):
    """A route's filter or partition key cannot be run safely (or yields no boolean): pause the route."""


@dataclass
class _Compiled:
    meta: routes_internal_pb2.RouteMeta
    filter: RecordFilter | None
    key: RecordExpression | None
    ops: frozenset[int]
    first_partition: int = 0  # rotates so one busy partition cannot starve the others


@dataclass
class _Pass:
    copies: list[Copy] = field(default_factory=list)
    advances: dict[int, int] = field(default_factory=dict)
    skipped: dict[int, int] = field(default_factory=dict)  # by source partition: records not copied
    lost: dict[int, int] = field(default_factory=dict)  # of those, the ones that should have been

    def count(self, partition: int, skipped: int, lost: int = 0) -> None:
        self.skipped[partition] = self.skipped.get(partition, 0) + skipped
        self.lost[partition] = self.lost.get(partition, 0) + lost

    def counted(self, partitions: Iterable[int]) -> tuple[int, int]:
        """(skipped, lost) of ``partitions``: those whose cursor moves past what was judged (the
        others are judged again by the next pass, and counted then)."""
        chosen = set(partitions)
        return (sum(n for p, n in self.skipped.items() if p in chosen),
                sum(n for p, n in self.lost.items() if p in chosen))


def _partial_advances(work: _Pass, handled: list[tuple[Copy, bool]]) -> dict[int, int]:
    """Where each source partition's cursor may go after only ``handled``, a prefix of
    ``work.copies``, went in: past its last handled copy when some of its copies did not go in, to
    where the pass read when all did (or it had none)."""
    done = len(handled)
    pending = {copy.source_partition for copy in work.copies[done:]}
    last: dict[int, int] = {}
    for copy, _ in handled:
        last[copy.source_partition] = copy.source_offset + 1
    return {p: (last[p] if p in pending else offset) for p, offset in work.advances.items()
            if p not in pending or p in last}


def _is_full(exc: BaseException) -> bool:
    """The target is full (``full_policy=reject``): a core error locally, an SDK error remotely."""
    return isinstance(exc, ResourceExhausted) or getattr(exc, "code", None) == "RESOURCE_EXHAUSTED"


def _is_poison(exc: Exception) -> bool:
    """A refusal that retrying cannot change (bad record for the target), as opposed to an outage:
    by the error's reason, the same for a core error (local) and an SDK error (remote)."""
    return refused_records(exc)


class RouteRunner:
    """The router thread of one node and its lanes; see the module docstring."""

    def __init__(self, state: BrokerStateMachine, table: RouteTable, appender: TrustedAppender,
                 submitter: CommandSubmitter, is_leader: Callable[[], bool],
                 remote: Callable[[list[str]], RemoteCluster], batch_records: int = BATCH_RECORDS,
                 batch_bytes: int = BATCH_BYTES, wake_s: float = WAKE_S,
                 held: Callable[[int], frozenset[int]] = lambda topic_id: frozenset()) -> None:
        """``wake_s``: the longest an idle router (or lane) waits before it looks at the routes again.
        ``held``: the partitions of a topic (by id) whose `memory` records this node lost and still
        expects to take back (``MemoryRefill.held``): a route whose cursor is in what it lost waits."""
        assert batch_records > 0 and batch_bytes > 0 and wake_s > 0
        self._state = state
        self._table = table
        self._appender = appender
        self._submitter = submitter
        self._is_leader = is_leader
        self._held = held
        self._remote_factory = remote
        self._connections = Connections(remote)  # run_once's (remote routes on the calling thread)
        self._lanes: dict[tuple[str, ...], Lane] = {}
        self._lanes_lock = threading.Lock()
        self._batch_records = batch_records
        self._batch_bytes = batch_bytes
        self._compiled: dict[int, _Compiled] = {}
        self.stats: dict[str, RouteStats] = {}
        self.passes = 0  # passes run by the thread (diagnostics; tests count wake-ups with it)
        self._wake_s = wake_s
        self._routes_seen = True  # the last pass found routes: applies wake the next one
        self._poked = threading.Event()  # wake() and stop(): a pass now, whatever the state did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="router", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the router thread and every lane (cancelling their calls in flight) and join them."""
        self._stop.set()
        self.wake()
        if self._thread.is_alive():
            self._thread.join(10)
        with self._lanes_lock:
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.retire()
        self._state.notify_change()  # lanes waiting for a change look at their stop flag
        for lane in lanes:
            if lane.thread is not None:
                lane.thread.join(10)
        self._connections.close()

    def wake(self) -> None:
        """Look at the routes now (e.g. one was just created)."""
        self._poked.set()
        self._state.notify_change()

    def lane_threads(self) -> list[threading.Thread]:
        """The threads of the lanes that have not ended yet (diagnostics and tests)."""
        with self._lanes_lock:
            return [lane.thread for lane in self._lanes.values() if lane.thread is not None and lane.alive()]

    # -- loop ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._is_leader():
                self._steer([])  # a follower runs no lane
                self._stop.wait(0.2)
                continue
            seen = self._state.version
            self._poked.clear()
            self.passes += 1
            try:
                routes = self._routes()
                self._steer(routes)
                progressed = self._pass([m for m in routes if not m.config.target_cluster], self._connections,
                                        self._stop)
            except Exception:  # noqa: BLE001 - a bug must not kill the router thread; it is logged
                log.exception("router pass failed")
                progressed = False
                self._stop.wait(1.0)
            if progressed:
                continue
            if self._routes_seen:  # woken by the next apply that changes the state (or by wake())
                self._state.wait_for_change(seen, self._wake_s)
            else:  # no route: applies do not concern the router (a route created here calls wake())
                self._poked.wait(self._wake_s)

    def _run_lane(self, lane: Lane) -> None:
        """A lane's loop: passes over the routes to ``lane.key`` until it is retired."""
        try:
            while not lane.stop.is_set():
                seen = self._state.version
                try:
                    routes = [m for m in self._table.all() if tuple(m.config.target_cluster) == lane.key]
                    progressed = self._pass(routes, lane.connections, lane.stop)
                except Exception:  # noqa: BLE001 - as in _run: logged, the lane goes on
                    log.exception("router lane %s: pass failed", ",".join(lane.key))
                    progressed = False
                    lane.stop.wait(1.0)
                if not progressed and not lane.stop.is_set():
                    self._state.wait_for_change(seen, self._wake_s)
        finally:
            lane.connections.close()

    def _steer(self, routes: Sequence[routes_internal_pb2.RouteMeta]) -> None:
        """Start a lane for each remote cluster that ``routes`` target (none once stopping) and retire
        the others; a retired lane is replaced only once its thread has ended (one thread per route)."""
        retired = False
        with self._lanes_lock:
            wanted = set() if self._stop.is_set() else \
                {tuple(m.config.target_cluster) for m in routes if m.config.target_cluster}
            for key, lane in list(self._lanes.items()):
                if key not in wanted and not lane.stop.is_set():
                    lane.retire()
                    retired = True
                if not lane.alive():  # retired and ended (or ended by a bug): a new one may start
                    del self._lanes[key]
            for key in wanted - self._lanes.keys():
                lane = self._lanes[key] = Lane(key, Connections(self._remote_factory))
                lane.thread = threading.Thread(target=self._run_lane, args=(lane,), daemon=True,
                                               name=f"router-{','.join(key)}")
                lane.thread.start()
        if retired:  # a retired lane waiting for a change looks at its stop flag
            self._state.notify_change()

    def run_once(self) -> bool:
        """One pass over every route, remote ones included, on the calling thread (tests; the
        router thread runs the remote routes on their lanes); True when some cursor moved."""
        return self._pass(self._routes(), self._connections, self._stop)

    def _routes(self) -> list[routes_internal_pb2.RouteMeta]:
        """The stored routes; forgets the statistics and compiled expressions of deleted ones."""
        routes = self._table.all()
        self._routes_seen = bool(routes)
        live = {m.config.name for m in routes}
        for name in [n for n in list(self.stats) if n not in live]:
            self.stats.pop(name, None)
        ids = {m.route_id for m in routes}
        for route_id in [i for i in list(self._compiled) if i not in ids]:
            self._compiled.pop(route_id, None)
        return routes

    def _pass(self, routes: Sequence[routes_internal_pb2.RouteMeta], connections: Connections,
              stop: threading.Event) -> bool:
        """One pass over ``routes`` (all worked by the calling thread); True when some cursor moved."""
        progressed = False
        for meta in routes:
            if stop.is_set() or not self._is_leader():
                break
            stats = self.stats.get(meta.config.name)
            if stats is None or stats.route_id != meta.route_id:
                stats = self.stats[meta.config.name] = RouteStats(meta.route_id)
            if stats.paused or time.monotonic() < stats.retry_at:
                continue
            try:
                progressed = self._route(self._compile(meta), stats, connections) or progressed
                stats.backoff_s = 0.0
            except _ExpressionRefused as exc:
                stats.paused = True
                stats.last_error = f"paused: {exc}"
                log.error("route %s paused: %s (delete and re-create it with an expression that is cheaper, "
                          "or always gives a boolean; re-created, it copies the retained records again)",
                          meta.config.name, exc)
            except Exception as exc:  # noqa: BLE001 - any failure of one route: report, back off, go on
                if stop.is_set():  # a call cancelled by stop or retirement: not the route's failure
                    break
                connections.forget(meta.config.target_cluster)
                stats.last_error = f"{type(exc).__name__}: {exc}"
                stats.backoff_s = min(BACKOFF_MAX_S, max(BACKOFF_MIN_S, stats.backoff_s * 2))
                stats.retry_at = time.monotonic() + stats.backoff_s
                log.info("route %s: %s (retrying in %.1f s)", meta.config.name, stats.last_error, stats.backoff_s)
        return progressed

    def _compile(self, meta: routes_internal_pb2.RouteMeta) -> _Compiled:
        """The route's checked expressions; a stored expression that the checks refuse now is never
        evaluated (``_ExpressionRefused``: the route is paused)."""
        compiled = self._compiled.get(meta.route_id)
        if compiled is None:
            config = meta.config
            try:
                compiled = _Compiled(
                    meta,
                    RecordFilter(config.filter) if config.filter else None,
                    RecordExpression(config.partition_key, "partition_key") if config.partition_key else None,
                    frozenset(config.ops))
            except InvalidArgument as exc:
                raise _ExpressionRefused(str(exc)) from None
            self._compiled[meta.route_id] = compiled
        return compiled

    # -- one route -----------------------------------------------------------------------------
    def _route(self, route: _Compiled, stats: RouteStats, connections: Connections) -> bool:
        config = route.meta.config
        source = self._state.topic(config.source)
        if source is None:
            stats.last_error = f"source topic {config.source!r} does not exist"
            return False
        remote = connections.get(config.target_cluster) if config.target_cluster else None
        echo_cluster = remote.cluster_id() if remote is not None else None
        if echo_cluster == self._appender.cluster_id:
            raise InvalidArgument(f"the target cluster is this cluster ({echo_cluster!r}); route to the topic instead")
        work = self._collect(route, source, echo_cluster)
        if not work.advances:
            return False
        handled: list[tuple[Copy, bool]] = []  # (copy, refused for good) as the target took them, in order
        try:
            if work.copies:
                self._deliver(config.target, work.copies, remote, handled)
        except Exception:
            # a prefix went in (a full_policy=reject target with room for part of the batch): the
            # cursor moves past it now; retried later under the same keys, it was stored again once
            # the dedup window had passed (17 records for 12)
            if handled:
                advances = _partial_advances(work, handled)
                counts = self._counts(handled, *work.counted(advances))
                self._advance(route, source, advances, counts)
                self._count(stats, counts)
            raise
        counts = self._counts(handled, *work.counted(work.skipped.keys() | work.lost.keys()))
        self._advance(route, source, work.advances, counts)
        self._count(stats, counts)
        stats.last_error = ""
        return True

    def _advance(self, route: _Compiled, source: internal_pb2.TopicMeta, advances: dict[int, int],
                 counts: tuple[int, int, int]) -> None:
        if not advances:
            return
        advance = routes_internal_pb2.AdvanceRouteCommand(
            name=route.meta.config.name, route_id=route.meta.route_id, source_topic_id=source.topic_id,
            partitions=list(advances), next_offsets=list(advances.values()))
        fmt = 0
        if self._state.cluster_format >= ROUTE_TOTALS_FORMAT:  # every member's code keeps the totals
            advance.copied, advance.skipped, advance.lost = counts
            fmt = ROUTE_TOTALS_FORMAT
        result = self._submitter.submit(internal_pb2.Command(advance_route=advance, format=fmt))
        if isinstance(result, Rejected):
            raise result.error

    @staticmethod
    def _counts(handled: list[tuple[Copy, bool]], skipped: int, lost: int) -> tuple[int, int, int]:
        """(copied, skipped, lost) of a pass: a copy the target refused for good is skipped and lost."""
        refused = sum(1 for _, was_refused in handled if was_refused)
        return len(handled) - refused, skipped + refused, lost + refused

    @staticmethod
    def _count(stats: RouteStats, counts: tuple[int, int, int]) -> None:
        stats.copied += counts[0]
        stats.skipped += counts[1]
        stats.lost += counts[2]

    def _collect(self, route: _Compiled, source: internal_pb2.TopicMeta, echo_cluster: str | None) -> _Pass:
        """Read and judge up to one batch of source records, partition by partition."""
        work = _Pass()
        budget_records, budget_bytes = self._batch_records, self._batch_bytes
        cursors = self._table.cursors(route.meta.config.name)
        count, tid = source.config.partitions, source.topic_id
        held = self._held(tid)
        route.first_partition = (route.first_partition + 1) % count
        for i in range(count):
            p = (route.first_partition + i) % count
            if budget_records <= 0 or budget_bytes <= 0:
                break
            st = self._state.partition(tid, p)
            stored_tid, stored = cursors.get(p, (0, 0))
            start = stored if stored_tid == tid else 0
            if start < st.start_offset and p in held and self._state.lost_at_start(tid, p) is not None:
                continue  # lost at this node's start, being taken back: it waits (counted lost, skipped for good)
            if start < st.start_offset:  # pruned or expired before it was routed: counted, not hidden
                log.warning("route %s: source records %d..%d of partition %d were deleted before they were "
                            "routed", route.meta.config.name, start, st.start_offset - 1, p)
                work.count(p, st.start_offset - start, st.start_offset - start)
                start = st.start_offset
            next_offset = start
            scan = list(record_log.read(self._state.records_store(tid), tid, p, start, st.end_offset, budget_records))
            work.count(p, 0, sum(1 for entry in scan if entry.error))  # unreadable (logged by _candidate)
            judged = [(entry.offset, self._candidate(route, source, p, entry, echo_cluster)) for entry in scan]
            for offset, copy in self._evaluate(route, source, judged):
                if copy is None:
                    work.count(p, 1)
                else:
                    work.copies.append(copy)
                    budget_bytes -= len(copy.body)
                budget_records -= 1
                next_offset = offset + 1
                if budget_bytes <= 0:
                    break
            if next_offset != stored or stored_tid != tid:
                work.advances[p] = next_offset
        return work

    def _evaluate(self, route: _Compiled, source: internal_pb2.TopicMeta,
                  judged: list[tuple[int, tuple[internal_pb2.Record, bytes] | None]]
                  ) -> list[tuple[int, Copy | None]]:
        """Run the filter and the partition key over the candidates of one scan, in one sandbox call
        each; ``_ExpressionRefused`` when an expression breaks its budget or a filter is not boolean."""
        candidates = [c for _, c in judged if c is not None]
        try:
            if route.filter is not None and candidates:
                matched = iter(route.filter.select([record for record, _ in candidates]))
                judged = [(o, c if c is not None and next(matched) else None) for o, c in judged]
                candidates = [c for _, c in judged if c is not None]
            keys = iter(self._partition_keys(route, [record for record, _ in candidates]))
        except (ExpressionBudgetExceeded, InvalidArgument) as exc:
            raise _ExpressionRefused(str(exc)) from None
        out: list[tuple[int, Copy | None]] = []
        for offset, candidate in judged:
            if candidate is None:
                out.append((offset, None))
                continue
            record, body = candidate
            out.append((offset, Copy(body, next(keys), record.partition,
                                     idempotency_key(self._appender.cluster_id, route.meta.route_id,
                                                     source.topic_id, record.partition, offset), offset)))
        return out

    def _candidate(self, route: _Compiled, source: internal_pb2.TopicMeta, partition: int, stored: record_log.Entry,
                   echo_cluster: str | None) -> tuple[internal_pb2.Record, bytes] | None:
        """A stored record (and its stored body) that the op list and echo rule let through to the
        expressions, or None when the route does not copy it."""
        name = route.meta.config.name
        offset = stored.offset
        problem = stored.error
        if problem is None:
            try:
                record = internal_pb2.Record.FromString(stored.body)
            except DecodeError as exc:
                problem = str(exc)
        if problem is not None:
            log.warning("route %s: skipped the unreadable record %d of partition %d: %s", name, offset,
                        partition, problem)
            return None
        record.topic, record.partition, record.offset = source.config.name, partition, offset
        record.timestamp_ms = stored.timestamp_ms
        if route.ops and record.op not in route.ops:
            return None
        if echo_cluster is not None and (origin_cluster(record.origin) == echo_cluster
                                         or record.headers.get(VIA_HEADER) == echo_cluster):
            return None  # back to where it came from: its origin, or the cluster that sent it here
        return record, stored.body if echo_cluster is None else sent_via(stored.body, self._appender.cluster_id)

    @staticmethod
    def _partition_keys(route: _Compiled, batch: list[internal_pb2.Record]) -> list[bytes | None]:
        """Per record: the expression's string/bytes/int result (an int as its decimal text), else
        (no expression, an evaluation error, another type) the record key."""
        results = route.key.evaluate_many(batch) if route.key is not None and batch else [("e", None)] * len(batch)
        out: list[bytes | None] = []
        for record, (kind, result) in zip(batch, results, strict=True):
            if kind == "v" and isinstance(result, bytes):
                out.append(result)
            elif kind == "v" and isinstance(result, str):
                out.append(result.encode())
            elif kind == "v" and isinstance(result, int) and not isinstance(result, bool):
                out.append(str(result).encode())
            else:
                out.append(record.key if record.HasField("key") else None)
        return out

    def _deliver(self, target: str, copies: list[Copy], remote: RemoteCluster | None,
                 handled: list[tuple[Copy, bool]]) -> None:
        """Append ``copies`` in order; ``handled`` gets each one the target took, or refused for good
        (True: skipped), in order, also when a later one raises."""
        def send(batch: list[Copy]) -> None:
            if remote is not None:
                remote.append(target, batch)
            else:
                self._appender.append(target, batch)
            handled.extend((copy, False) for copy in batch)

        try:
            send(copies)
            return
        except Exception as exc:  # noqa: BLE001 - core errors locally, SDK errors remotely
            if _is_full(exc) and len(copies) > 1:
                # a full_policy=reject target with room for fewer: the prefix that fits goes in (before,
                # the whole batch was retried for good while the target had room, "0 records + 12 would
                # pass max_records=5"); what does not fit raises, and the route backs off as for full
                half = len(copies) // 2
                self._deliver(target, copies[:half], remote, handled)
                self._deliver(target, copies[half:], remote, handled)
                return
            if not _is_poison(exc) or _is_full(exc):
                raise
        for copy in copies:  # one by one: skip only what the target refuses for good
            try:
                send([copy])
            except Exception as exc:  # noqa: BLE001 - as above
                if not _is_poison(exc):
                    raise
                handled.append((copy, True))
                log.warning("route to %s: the target refused the copy %s for good: %s", target,
                            copy.idempotency_key, exc)
