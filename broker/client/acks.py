"""The sync consumer's ack coalescing: concurrent ``ack`` calls of one consumer share ``Ack``
requests, one request in flight per consumer (as :mod:`broker.client.aio.acks` for the asyncio
consumer).

An ``Ack`` costs the leader a round of Raft whatever it carries (one replicated command). With
``client.run(..., ack="manual", concurrency=16)`` each handler's ``message.ack()`` was a call of its
own, so a consumer acked about one round trip's worth of messages per thread: ~520 msg/s on three
local nodes, against ~1,400-2,300 with ``ack="auto"``, whose settling thread already sends what is
queued together (bench/NOTE.md, 2026-12-06). Here the thread whose ack finds no request in flight
sends it at once, as before; an ack that finds one waits, and when the answer comes back the
thread at the head of the queue sends every ack queued by then as the next request (up to
:data:`ACK_POSITIONS_MAX` positions; a larger ack goes alone), as :class:`ThreadCoalescer` does
for publishes.

Each caller still returns once a request carrying its positions was answered, with its own
answer: per position, whether that request settled it. ``AckResponse.not_settled`` lists the
positions a request did not settle (settled before, or a repeat of one earlier in the request), so
callers sharing a request never get each other's counts. A server that does not send the list
(older than this field) is answered in request order: the first ``settled`` positions count as
settled. A refusal that settles nothing and may be about one caller's positions
(INVALID_ARGUMENT with a definite outcome, e.g. a position of another topic) sends each caller's
positions again alone, so each gets its own answer; any other error is every caller's in the
request (their records are then not settled: the leases run out and they come back, at-least-once).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from broker.client.coalescing import HandOff, Slot
from broker.client.errors import BrokerError, InvalidArgument

ACK_POSITIONS_MAX = 1000  # positions per shared request (the leader takes up to 10,000 per call)


def settled_each(settled: int, not_settled: Sequence[int], count: int) -> list[bool]:
    """Per position of a request of ``count`` positions, whether it settled it, from an
    ``AckResponse``'s fields (see the module docstring for a server without ``not_settled``)."""
    if settled + len(not_settled) == count and all(0 <= i < count for i in not_settled):
        answer = [True] * count
        for i in not_settled:
            answer[i] = False
        return answer
    settled = max(0, min(settled, count))
    return [True] * settled + [False] * (count - settled)


def split(answer: list[bool], sizes: Sequence[int]) -> list[list[bool]]:
    """A shared request's per-position ``answer`` cut into its callers' parts, of ``sizes``."""
    parts, at = [], 0
    for size in sizes:
        parts.append(answer[at:at + size])
        at += size
    return parts


def resend_alone(err: BrokerError, callers: int) -> bool:
    """Whether a shared request's callers go again one by one (see the module docstring): it was
    refused as INVALID_ARGUMENT, which settles nothing, with a definite outcome."""
    return callers > 1 and isinstance(err, InvalidArgument) and not err.after_unknown_outcome


class _Slot(Slot):
    """One thread's ack."""

    __slots__ = ("positions", "settled")

    def __init__(self, positions: list[bytes]) -> None:
        super().__init__()
        self.positions = positions
        self.settled: list[bool] | None = None

    def answered(self) -> bool:
        return self.settled is not None or super().answered()


class ThreadAckCoalescer:
    """One consumer's queue of acks waiting for the request in flight (:class:`HandOff`); ``send``
    sends one request and answers per position whether it settled it (:func:`settled_each`)."""

    def __init__(self, send: Callable[[list[bytes]], list[bool]]) -> None:
        self._send_request = send
        self.queue: HandOff[_Slot] = HandOff(_take, self._send,
                                             "the acking thread was interrupted before this ack's answer")

    def ack(self, positions: list[bytes]) -> list[bool]:
        """Per position, whether the request that carried it settled its record."""
        if not positions:
            return []
        slot = _Slot(positions)
        self.queue.run(None, slot)
        assert slot.settled is not None
        return slot.settled

    def _send(self, taken: list[_Slot]) -> None:
        positions = [p for slot in taken for p in slot.positions]
        try:
            settled = self._send_request(positions)
        except Exception as err:  # noqa: BLE001 - whatever it is, it is every caller's answer
            if isinstance(err, BrokerError) and resend_alone(err, len(taken)):
                for slot in taken:  # nothing was settled: each caller's positions alone, its own answer
                    self._send([slot])
                return
            for slot in taken:
                slot.error = err
            return
        for slot, answer in zip(taken, split(settled, [len(slot.positions) for slot in taken]), strict=True):
            slot.settled = answer


def _take(queue: collections.deque[_Slot]) -> list[_Slot]:
    """The next request's callers: the head of the queue, and those after it while they fit."""
    taken = [queue.popleft()]
    size = len(taken[0].positions)
    while queue and size + len(queue[0].positions) <= ACK_POSITIONS_MAX:
        slot = queue.popleft()
        taken.append(slot)
        size += len(slot.positions)
    return taken
