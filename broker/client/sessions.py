"""The SDK's producer sessions (SPEC §4): how a publish without caller keys is made exactly-once.

A session is a random ``dedup_id`` of the client's own and the next message id of that session on
one topic. A call takes a free session of its topic (or opens a new one), sends its batch as that
session's messages ``next .. next + n - 1`` (``PublishRequest.first_msg_id``; every retry of the call
resends the very same request) and gives the session back when the outcome is known:

- stored (or answered as a duplicate of an earlier attempt): the session moves past the batch;
- refused for good before anything was stored (a definite error): the numbers are reused;
- outcome unknown (the call raised after an attempt whose answer was lost): the session is
  dropped, since the cluster may or may not hold the batch; the next call opens a new one.

So a session is used by one call at a time and its batches reach the leader in order, whatever
the number of threads (or asyncio tasks) publishing: concurrent calls use different sessions,
never interleaved numbers of one. The broker keeps per session its watermark and the places of its
last batch, so a retry answers the original places with ``duplicate=True``. A session out of
sequence (its topic re-created, its watermark reset, or forgotten after being idle for longer
than the topic's dedup window) is answered by a new session
(:class:`SessionOutOfSequence` says nothing was stored). Thread-safe.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from broker.client.errors import BrokerError, SessionOutOfSequence
from broker.client.wire import PublishCall
from broker.v1 import broker_pb2

DEDUP_ID_PREFIX = "sdk-"  # a session opened by the SDK (the watermarks list shows it as such)


@dataclass(slots=True)
class Session:
    """One producer session on one topic: its ``dedup_id`` and the id its next message gets."""

    dedup_id: str
    next_msg_id: int = 1


class SessionPool:
    """Free sessions per topic; :meth:`take` hands each to one call, :meth:`give_back` returns it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free: dict[str, list[Session]] = {}
        self.opened = 0  # sessions opened so far (for tests and diagnostics)

    def take(self, topic: str) -> Session:
        """A session no other call is using (a free one of ``topic``, else a new one)."""
        with self._lock:
            free = self._free.get(topic)
            if free:
                return free.pop()
            self.opened += 1
        return Session(DEDUP_ID_PREFIX + uuid.uuid4().hex)

    def give_back(self, topic: str, session: Session) -> None:
        """Return a session whose every call has a known outcome (its ``next_msg_id`` is exact)."""
        with self._lock:
            self._free.setdefault(topic, []).append(session)

    def stored(self, topic: str, session: Session, count: int) -> None:
        """The call's batch of ``count`` records is in the cluster: the session moves past it."""
        session.next_msg_id += count
        self.give_back(topic, session)

    def failed(self, topic: str, session: Session, err: BaseException) -> bool:
        """Settle a session after its call raised ``err``; True when the batch should be sent again
        in a new session (the cluster refused it as out of sequence: nothing was stored)."""
        if isinstance(err, BrokerError) and not err.after_unknown_outcome:
            if isinstance(err, SessionOutOfSequence):  # the topic's sessions were forgotten by the cluster
                self.forget(topic)  # (a re-created topic, reset watermarks): drop this one and the free ones
                return True
            self.give_back(topic, session)  # refused for good: nothing stored, the numbers are reused
        return False  # outcome unknown (or not a broker error): dropped, a new call opens a new one

    def forget(self, topic: str) -> None:
        """Drop ``topic``'s free sessions (e.g. after the topic was dropped)."""
        with self._lock:
            self._free.pop(topic, None)


Send = Callable[[bytes], broker_pb2.PublishResponse]  # one call (with its retries) of a serialized request


def publish_in_session(pool: SessionPool, call: PublishCall, send: Send) -> broker_pb2.PublishResponse:
    """Send ``call`` (a batch without caller keys) as the next range of a session of ``pool``;
    ``send`` makes one call with its retries. A session out of sequence is replaced once."""
    topic = call.topic
    for attempt in range(2):
        session = pool.take(topic)
        try:
            response = send(call.data(session.dedup_id, session.next_msg_id))
        except BaseException as err:
            if pool.failed(topic, session, err) and attempt == 0:
                continue
            raise
        pool.stored(topic, session, call.count)
        return response
    raise AssertionError("unreachable: the second attempt returns or raises")
