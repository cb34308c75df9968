"""Taking back, from the other nodes, the records of `memory` topics that this node lost at its
start (docs/design/memory-topics.md, "Taking the records back").

A `memory` topic's records are replicated like any other, but each node keeps them in its own
memory: a restarted node has none of them (``BrokerStateMachine.lost_at_start``), while the nodes
that kept running still do. Without this, a rolling restart (every node in turn, as an upgrade on
Kubernetes does) lost every record of every `memory` topic, and a restarted node that led told its
consumer groups to skip what the others still held.

How: a daemon thread on every node looks, every :data:`REFILL_PERIOD_S`, for the partitions it lost
records of (``lost_partitions``, from command format 5 on). For each it reads the lost offsets back
from another node through that node's own ``Subscribe`` (a stateless read with ``stop_at_end``,
which a follower serves), newest first in chunks of at most :data:`CHUNK_BYTES` (by the sizes in
the records' skeletons), each chunk ending just below what this node holds, and hands each to
``BrokerStateMachine.refill``, which checks every record against the skeleton the apply wrote for
it (its body size and timestamp) and starts the readers' view at the chunk's first record. So
what a node holds stays one run of offsets with no gap, and a reader or a group never meets a hole.

A node that holds only the chunk's newer part (it lost or cut the older ones: a ``SKIP_FORWARD``
before them) gives that tail; the longest tail any node gives is taken. A node that does not
answer, or gives nothing that reaches this node's records, is passed over. A span from which no
node gives anything is "stalled" and no longer holds the node's readiness back
(:meth:`MemoryRefill.pending`); it is asked for again after 1, 2, 4 ... up to
:data:`STALLED_RETRY_S_MAX` seconds (a member that was down may have come back). Nothing is
replicated: every node already counted these records. While the node replays its Raft journal at
its start, nothing is taken (the replay moves the view) and the node is not ready. A cluster whose nodes check callers'
credentials lets this through only if the node's own certificate (mTLS) may read the topic; else
the records stay lost on the restarted node, as before (logged once per partition).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from broker.core import formats
from broker.core.errors import BrokerError
from broker.core.records import PositionToken
from broker.core.state_machine import BrokerStateMachine, LostSpan
from broker.v1 import broker_pb2, broker_pb2_grpc, common_pb2

log = logging.getLogger(__name__)

REFILL_PERIOD_S = 1.0  # how often a node looks for records it lost
# Tests only: another period (e.g. hours: a node that stays "taking them back"); unset in production
REFILL_PERIOD_ENV = "RAFTBROKER_TEST_REFILL_PERIOD_S"
CHUNK_BYTES = 4 * 1024 * 1024  # at most this many counted bytes of records are read back at a time (or one record)
CHUNK_RECORDS_MAX = 20_000  # and at most this many records
READ_TIMEOUT_S = 10.0  # one chunk's read from one node
# a node taking records back starts no election for at most this long after a leader is lost (node.py)
CAMPAIGN_DEFERRAL_S_MAX = 5.0
STALLED_RETRY_S_MAX = 60.0  # a span no node gave anything of is asked for again at most this far apart
# a leader's groups and routes wait for a span that came back empty because a member could not be
# reached (or its read failed) until this many tries in a row did (tries 1, 2, 4 s apart: about 7 s,
# plus a hung member's READ_TIMEOUT_S each); when every member answered and none had it, not at all
HOLD_TRIES_MAX = 4
# the channel options of a kept peer channel (services/peer_status.py): a node that was down is tried
# again within a second
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                   ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.max_receive_message_length", 64 << 20))
# what a returned record carries beyond its stored body (RecordBody shares Record's field numbers 4-11)
_NOT_BODY = ("topic", "partition", "offset", "timestamp_ms", "position", "delivery_attempt")

Entry = tuple[int, int, bytes]  # (offset, timestamp_ms, body)


def period_from_env() -> float:
    """:data:`REFILL_PERIOD_S`, or the test setting :data:`REFILL_PERIOD_ENV` (a positive number)."""
    raw = os.environ.get(REFILL_PERIOD_ENV, "")
    if not raw:
        return REFILL_PERIOD_S
    try:
        period = float(raw)
    except ValueError:
        period = 0.0
    if not 0 < period < float("inf"):
        raise ValueError(f"{REFILL_PERIOD_ENV}={raw!r}: expected a positive number of seconds")
    return period


def body_of(record: common_pb2.Record) -> bytes:
    """The stored body of a record another node returned (what its producer gave)."""
    for name in _NOT_BODY:
        record.ClearField(name)
    return record.SerializeToString()


class MemoryRefill:
    """Reads lost `memory` records back from other nodes (module docstring); one daemon thread."""

    def __init__(self, state: BrokerStateMachine, peer_addresses: Callable[[], list[str]],
                 channel: Callable[..., grpc.Channel] = grpc.insecure_channel,
                 period_s: float = REFILL_PERIOD_S) -> None:
        """``peer_addresses()``: the gRPC addresses of the other members, now; ``channel(address,
        options=...)`` opens a channel to one (a TLS node's presents its certificate)."""
        self._state = state
        self._peer_addresses = peer_addresses
        self._open = channel
        self._period_s = period_s
        self._channels: dict[str, grpc.Channel] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-refill", daemon=True)
        self._refused: set[tuple[int, int]] = set()  # partitions whose refusal was logged
        # (topic id, partition, view start) of lost spans that no other node gave anything of on the
        # last try -> (tries so far, when to ask again): asked again after 1, 2, 4 ... up to
        # STALLED_RETRY_S_MAX seconds (a whole-cluster restart leaves every partition stalled for good)
        # (the third item: every member answered on the last try, none gave anything)
        self._stalled: dict[tuple[int, int, int], tuple[int, float, bool]] = {}
        # topic id -> partitions whose lost records this node still expects to take back (not
        # stalled): its consumer groups, if it leads, deliver nothing of them meanwhile (:meth:`held`)
        self._held: dict[int, frozenset[int]] = {}
        # when to compute _held again: it counts every pass and every span that stalled (a span taken
        # back or cut meanwhile is checked by the caller; a span is lost only at a load or a replay)
        self._stalled_changes = 0
        self._held_at: int | None = None  # the count _held was computed at

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        for channel in list(self._channels.values()):  # ends a read in flight (CANCELLED)
            channel.close()
        if self._thread.is_alive():
            self._thread.join(READ_TIMEOUT_S + 5)
        for channel in list(self._channels.values()):
            channel.close()
        self._channels.clear()

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            try:
                self.refill_all()
            except Exception:  # noqa: BLE001 - a bug here must not end the thread: tried again next period
                if not self._stop.is_set():  # stopping closes the channels under a read in flight
                    log.exception("taking back lost memory records failed; tried again in %.0f s", self._period_s)

    def held(self, topic_id: int) -> frozenset[int]:
        """The partitions of ``topic_id`` whose lost records this node still expects to take back:
        some were lost at its start, and the last try to take them back was not empty (or none was
        made yet, or a member could not be reached on fewer than :data:`HOLD_TRIES_MAX` tries in a
        row). A leader's consumer groups deliver nothing of these partitions meanwhile, and tell no
        SKIP_FORWARD (``GroupRuntime``), nor do its routes copy past them (``RouteRunner``): a group
        told to skip moves past the records for good, although another member still holds them.
        Once every member answered with nothing, or none could be reached that many times, the
        groups are told. Computed again at each pass (every :data:`REFILL_PERIOD_S`) and when a span
        stalls, so a partition taken back or cut past since may still be in it: a caller checks
        ``BrokerStateMachine.lost_at_start`` too. Empty before command format 5 (nothing is taken
        back then)."""
        at = self._stalled_changes  # not per apply: a node that lost thousands of partitions for good
        if at != self._held_at:     # would walk them after every append
            self._update_held()
            self._held_at = at
        return self._held.get(topic_id, frozenset())

    def _update_held(self) -> None:
        """Recompute :meth:`held` (one swap: group streams read it from their threads)."""
        if self._state.cluster_format < formats.MEMORY_SKELETON_FORMAT:
            self._held = {}
            return
        stalled = self._stalled
        by_topic: dict[int, set[int]] = {}
        for tid, partition, view_start in self._state.lost_views():
            tried = stalled.get((tid, partition, view_start))
            if tried is None or (not tried[2] and tried[0] < HOLD_TRIES_MAX):
                by_topic.setdefault(tid, set()).add(partition)
        self._held = {tid: frozenset(partitions) for tid, partitions in by_topic.items()}

    def pending(self) -> bool:
        """Whether some lost records have not been asked for yet, or came back on the last try (more
        may follow): a follower is not ready meanwhile (``services/health.py``), so that a rolling
        restart does not take down the nodes it takes them back from. Records that no other node
        could give (a whole-cluster restart lost them everywhere, or the others are down) do not
        hold it back; they are asked for again later (:data:`STALLED_RETRY_S_MAX`)."""
        return self._state.replaying or self.unasked()

    def unasked(self) -> bool:
        """Whether some lost span has not been asked for yet, or came back on the last try; false
        while the journal replays (nothing is asked for then). What defers this node's campaigns
        (node.py): a replay waits for a leader's commit index, so deferring on it would keep a
        restarted cluster without a leader for the whole deferral."""
        stalled = self._stalled
        return any((s.topic_id, s.partition, s.view_start) not in stalled for s in self._state.lost_partitions())

    def refill_all(self) -> int:
        """One pass: every lost partition, as far back as the other nodes give (a stalled one when
        its time to ask again has come); returns the records taken."""
        taken = 0
        now = time.monotonic()
        spans = self._state.lost_partitions()
        live = {(span.topic_id, span.partition, span.view_start) for span in spans}
        # one swap (pending() reads it from other threads): spans gone or moved on are forgotten
        self._stalled = {key: when for key, when in self._stalled.items() if key in live}
        self._stalled_changes += 1
        for span in spans:
            stalled = self._stalled.get((span.topic_id, span.partition, span.view_start))
            if stalled is None or stalled[1] <= now:
                taken += self._refill(span)
        return taken

    def _refill(self, span: LostSpan) -> int:
        taken = 0
        while not self._stop.is_set():
            begin = self._state.refill_chunk_start(span, CHUNK_BYTES, CHUNK_RECORDS_MAX)
            entries, answered = self._fetch(span, begin)
            got = self._state.refill(span.topic_id, span.partition, entries) if entries else 0
            if not got:
                key3 = (span.topic_id, span.partition, span.view_start)
                tries = self._stalled.get(key3, (0, 0.0, False))[0] + 1
                self._stalled[key3] = (tries, time.monotonic() + min(2.0 ** (tries - 1), STALLED_RETRY_S_MAX),
                                       answered)
                self._stalled_changes += 1
                if answered or tries == HOLD_TRIES_MAX:
                    self._state.notify_change()  # a group that waited for it is told the skip now
                break
            taken += got
            still = self._state.lost_span(span)
            if still is None:
                log.info("topic %r partition %d: took back every record this node lost at its start "
                         "(%d in this pass)", span.topic, span.partition, taken)
                break
            span = still
        return taken

    def _fetch(self, span: LostSpan, begin: int) -> tuple[list[Entry], bool]:
        """The most of offsets ``[begin, span.view_start)`` that another node holds up to the end:
        all of them from the first node that has them all, else the longest tail any node has (the
        others cut or lost the older ones: a whole-cluster restart, or retention that passed this
        node's start), else []; and whether every member answered (False: one could not be reached
        or its read failed, e.g. it hung: the next try may get more)."""
        want = span.view_start - begin
        best: list[Entry] = []
        answered = True
        for address in self._peer_addresses():
            try:
                entries = list(self._read(address, span, begin, want))
            except BrokerError as exc:  # e.g. a position token it cannot decode
                log.debug("reading lost records back from %s failed: %s", address, exc)
                continue
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else None
                if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                    if (span.topic_id, span.partition) not in self._refused:
                        self._refused.add((span.topic_id, span.partition))
                        log.warning("topic %r partition %d: node %s refuses this node's read (%s): the records "
                                    "this node lost stay lost here", span.topic, span.partition, address, code)
                else:
                    answered = False
                    log.debug("reading lost records back from %s failed: %s", address, exc)
                continue
            if not entries or entries[-1][0] != span.view_start - 1:
                continue  # it stopped short of what this node holds: nothing of it adjoins
            if len(entries) == want:
                return entries, True
            if len(entries) > len(best):
                best = entries
        return best, answered

    def _read(self, address: str, span: LostSpan, begin: int, want: int) -> Iterator[Entry]:
        """The records ``address`` holds of ``[begin, begin + want)``, consecutive, in order: from
        ``begin``, or from where a SKIP_FORWARD it sends first moves on to (it lost or cut the
        older ones); they stop at a later gap or event."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._open(address, options=CHANNEL_OPTIONS)
        request = broker_pb2.SubscribeRequest(topic=span.topic, partition=span.partition, stop_at_end=True,
                                              **{"from": common_pb2.Position(offset=begin)})
        call = broker_pb2_grpc.BrokerStub(channel).Subscribe(request, timeout=READ_TIMEOUT_S)
        expected, end = begin, begin + want
        try:
            for response in call:
                if not response.HasField("batch"):
                    event = response.event
                    if (expected != begin or event.type != common_pb2.EVENT_TYPE_SKIP_FORWARD
                            or not begin < event.offset_after < end):
                        return  # an event after records, or past what is wanted: nothing more adjoins
                    expected = event.offset_after
                    continue
                records = response.batch.records
                if records and PositionToken.decode(records[0].position).incarnation != span.topic_id:
                    return  # the topic was dropped and re-created there: these are another topic's
                for record in records:
                    if record.offset != expected:
                        return
                    yield expected, record.timestamp_ms, body_of(record)
                    expected += 1
                    if expected == end:
                        return
        finally:
            call.cancel()
