"""The sync client's publish coalescing (:class:`broker.client.coalescing.ThreadCoalescer`), on a
scripted send: threads that publish while a request is in flight go together in the next request,
sent by the thread at the head of the queue; each caller gets its own answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest

from broker.client.coalescing import Item, ThreadCoalescer
from broker.client.errors import InvalidArgument, Unavailable
from broker.client.models import OutgoingRecord, PublishResult, PublishResults

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Broker:
    """Records each request (and the thread that sent it); waits for ``gate`` while ``hold``."""

    def __init__(self) -> None:
        self.requests: list[tuple[list[bytes], str]] = []
        self.stored: list[bytes] = []
        self.hold = threading.Event()
        self.gate = threading.Semaphore(0)
        self.refuse: dict[bytes, Exception] = {}
        self.fail_all: Exception | None = None
        self._lock = threading.Lock()

    def send(self, topic: str, items: Sequence[Item]) -> PublishResults:
        raw = [i.value if isinstance(i, OutgoingRecord) else i for i in items]
        values = [v.encode() if isinstance(v, str) else v for v in raw]
        with self._lock:
            self.requests.append((values, threading.current_thread().name))
        if self.hold.is_set():
            assert self.gate.acquire(timeout=10)
        if self.fail_all is not None:
            raise self.fail_all
        for value in values:
            if value in self.refuse:
                raise self.refuse[value]
        with self._lock:
            first = len(self.stored)
            self.stored += values
        return PublishResults(len(values), lambda: [PublishResult(0, first + k, False, 0) for k in range(len(values))])


def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


class Caller(threading.Thread):
    def __init__(self, co: ThreadCoalescer, value: bytes, topic: str = "t") -> None:
        super().__init__(name=value.decode(), daemon=True)
        self.co, self.value, self.topic = co, value, topic
        self.outcome: PublishResult | BaseException | None = None

    def run(self) -> None:
        try:
            self.outcome = self.co.publish(self.topic, OutgoingRecord(self.value))
        except BaseException as err:  # noqa: BLE001 - the test reads it
            self.outcome = err


def _held() -> tuple[Broker, ThreadCoalescer, Caller]:
    """A coalescer whose first publish (b"a", topic "t") is in flight, held until ``broker.gate`` is released."""
    broker = Broker()
    broker.hold.set()
    co = ThreadCoalescer(broker.send)
    first = Caller(co, b"a")
    first.start()
    _until(lambda: len(broker.requests) == 1)
    return broker, co, first


def _queued(co: ThreadCoalescer, topic: str = "t") -> int:
    return co.queues.waiting(topic)


def test_threads_that_publish_during_a_request_go_together_and_the_head_of_the_queue_sends() -> None:
    broker, co, first = _held()
    rest = []
    for i in range(4):  # one at a time, so the queue's order is known
        caller = Caller(co, b"r%d" % i)
        caller.start()
        rest.append(caller)
        _until(lambda: _queued(co) == len(rest))  # the first's record left the queue with its request
    broker.gate.release()
    first.join(5)
    assert isinstance(first.outcome, PublishResult) and first.outcome.offset == 0
    _until(lambda: len(broker.requests) == 2)
    assert broker.requests[1] == ([b"r0", b"r1", b"r2", b"r3"], "r0"), "the thread at the head sends the next request"
    broker.hold.clear()
    broker.gate.release()
    for caller in rest:
        caller.join(5)
    assert [c.outcome.offset for c in rest] == [1, 2, 3, 4]  # type: ignore[union-attr]
    assert co.queues.idle(), "the topic's queue is gone once nobody waits"
    assert co.publish("t", OutgoingRecord(b"alone")).offset == 5


def test_a_refused_request_is_sent_again_record_by_record_so_only_the_bad_one_fails() -> None:
    broker = Broker()
    broker.hold.set()
    broker.refuse[b"bad"] = InvalidArgument("INVALID_ARGUMENT", "not what the schema allows")
    co = ThreadCoalescer(broker.send)
    first = Caller(co, b"a")
    first.start()
    _until(lambda: len(broker.requests) == 1)
    rest = []
    for value in (b"b", b"bad", b"c"):
        caller = Caller(co, value)
        caller.start()
        rest.append(caller)
        _until(lambda: _queued(co) == len(rest))
    broker.hold.clear()
    broker.gate.release()
    for caller in (first, *rest):
        caller.join(5)
    assert isinstance(rest[1].outcome, InvalidArgument)
    assert [c.outcome.offset for c in (first, rest[0], rest[2])] == [0, 1, 2]  # type: ignore[union-attr]
    assert [r for r, _ in broker.requests] == [[b"a"], [b"b", b"bad", b"c"], [b"b"], [b"bad"], [b"c"]]


@pytest.mark.parametrize("error", [InvalidArgument("INVALID_ARGUMENT", "refused", after_unknown_outcome=True),
                                   Unavailable("UNAVAILABLE", "no leader within the retry deadline")],
                         ids=["unknown-outcome", "cluster-wide"])
def test_an_unknown_outcome_or_a_cluster_error_reaches_every_caller_and_is_not_resent(error: Exception) -> None:
    broker, co, first = _held()
    rest = [Caller(co, b"b"), Caller(co, b"c")]
    for caller in rest:
        caller.start()
    _until(lambda: _queued(co) == 2)
    broker.fail_all = error
    broker.hold.clear()
    broker.gate.release()
    for caller in (first, *rest):
        caller.join(5)
    assert first.outcome is error and all(c.outcome is error for c in rest)
    assert len(broker.requests) == 2, "never resent record by record"
    broker.fail_all = None
    assert co.publish("t", OutgoingRecord(b"d")).offset == 0, "the topic's queue works on"


def test_topics_do_not_wait_for_each_other_and_a_bad_record_fails_at_its_own_call() -> None:
    broker, co, first = _held()
    broker.hold.clear()
    assert co.publish("u", OutgoingRecord(b"x")).offset == 0, "another topic's request is not queued behind"
    with pytest.raises(InvalidArgument, match="op"):
        co.publish("t", OutgoingRecord(b"v", op="explode"))
    broker.gate.release()
    first.join(5)
    assert isinstance(first.outcome, PublishResult)
