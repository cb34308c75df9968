"""The sync consumer's ack coalescing (``broker.client.acks``), driven with a scripted send from
real threads: who travels together, what each caller gets back, errors."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from broker.client.acks import ACK_POSITIONS_MAX, ThreadAckCoalescer, settled_each
from broker.client.errors import InvalidArgument, Unavailable
from tests.conftest import wait_until

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Script:
    """A send that records each request and blocks until the test answers it: per position,
    settled unless it is in ``refused`` (``settled_each`` as the server's response would give)."""

    def __init__(self, settled_before: frozenset[bytes] = frozenset()) -> None:
        self.settled_before = set(settled_before)
        self.requests: list[list[bytes]] = []
        self.gates: list[threading.Event] = []
        self.errors: dict[int, Exception] = {}
        self.lock = threading.Lock()

    def send(self, positions: list[bytes]) -> list[bool]:
        gate = threading.Event()
        with self.lock:
            index = len(self.requests)
            self.requests.append(positions)
            self.gates.append(gate)
        gate.wait()
        if index in self.errors:
            raise self.errors[index]
        answer = []
        for p in positions:  # as the leader: a position settled before, or earlier in this request, is not
            answer.append(p not in self.settled_before)
            self.settled_before.add(p)
        return answer

    def answer(self, index: int, error: Exception | None = None) -> None:
        wait_until(lambda: len(self.gates) > index, 10, f"request {index} sent")
        if error is not None:
            self.errors[index] = error
        self.gates[index].set()


class Caller(threading.Thread):
    """A thread that makes one ack and keeps what it returned or raised."""

    def __init__(self, acks: ThreadAckCoalescer, positions: list[bytes]) -> None:
        super().__init__(daemon=True)
        self.acks, self.positions = acks, positions
        self.result: list[bool] | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self.acks.ack(self.positions)
        except BaseException as exc:  # noqa: BLE001 - kept for the test to look at
            self.error = exc

    def answer(self) -> list[bool] | None:
        self.join(10)
        assert not self.is_alive(), "the caller returned"
        return self.result


def queued(acks: ThreadAckCoalescer, script: Script, positions: list[list[bytes]]) -> list[Caller]:
    """Callers of ``positions`` that all wait behind the request in flight (``script.requests[0]``)."""
    callers = []
    for p in positions:
        callers.append(Caller(acks, p))
        wait_until(_waiting(acks, len(callers)), 10, "the caller queued")
    return callers


def _waiting(acks: ThreadAckCoalescer, n: int) -> Callable[[], bool]:
    return lambda: acks.queue.waiting(None) == n


def test_a_lone_ack_goes_at_once_and_acks_that_wait_share_the_next_request_each_with_its_own_answer() -> None:
    script = Script(settled_before=frozenset({b"c"}))
    acks = ThreadAckCoalescer(script.send)
    first = Caller(acks, [b"a"])
    wait_until(lambda: len(script.requests) == 1, 10, "the lone ack sent at once")
    later = queued(acks, script, [[b"b", b"c"], [b"d"], [b"b"]])
    assert len(script.requests) == 1, "nothing else is sent while a request is in flight"
    script.answer(0)
    assert first.answer() == [True]
    script.answer(1)
    assert [c.answer() for c in later] == [[True, False], [True], [False]], \
        "c was settled before; the second b is a repeat, so its caller did not settle it"
    assert script.requests == [[b"a"], [b"b", b"c", b"d", b"b"]]
    assert acks.queue.idle(), "the queue is gone once nothing waits"
    assert Caller(acks, []).answer() == [] and len(script.requests) == 2, "an empty ack sends nothing"


def test_a_shared_request_holds_at_most_the_maximum_and_a_larger_ack_goes_alone() -> None:
    script = Script()
    acks = ThreadAckCoalescer(script.send)
    first = Caller(acks, [b"x"])
    wait_until(lambda: len(script.requests) == 1, 10, "sent")
    big = [b"big%d" % i for i in range(ACK_POSITIONS_MAX + 1)]
    half = [b"h%d" % i for i in range(ACK_POSITIONS_MAX // 2)]
    callers = queued(acks, script, [big, half, half[:1] + [b"other"], [b"last"] * (ACK_POSITIONS_MAX // 2)])
    for i in range(4):
        script.answer(i)
    assert first.answer() == [True]
    assert [len(r) for r in script.requests] == [1, ACK_POSITIONS_MAX + 1, ACK_POSITIONS_MAX // 2 + 2,
                                                 ACK_POSITIONS_MAX // 2]
    assert callers[1].answer() == [True] * len(half) and callers[2].answer() == [False, True]
    assert callers[3].answer() == [True] + [False] * (ACK_POSITIONS_MAX // 2 - 1)


def test_an_invalid_argument_sends_each_caller_alone_and_other_errors_are_every_callers() -> None:
    script = Script()
    acks = ThreadAckCoalescer(script.send)
    first = Caller(acks, [b"a"])
    wait_until(lambda: len(script.requests) == 1, 10, "sent")
    shared = queued(acks, script, [[b"b"], [b"bad"], [b"c"]])
    script.answer(0)
    assert first.answer() == [True]
    script.answer(1, InvalidArgument("INVALID_ARGUMENT", "position of partition 9 offset 0 is not a record of 't'"))
    script.answer(2)
    script.answer(3, InvalidArgument("INVALID_ARGUMENT", "position of partition 9 offset 0 is not a record of 't'"))
    script.answer(4)
    assert shared[0].answer() == [True] and shared[2].answer() == [True], "the others' acks went through"
    assert shared[1].answer() is None and isinstance(shared[1].error, InvalidArgument)
    assert script.requests[1:] == [[b"b", b"bad", b"c"], [b"b"], [b"bad"], [b"c"]]

    first = Caller(acks, [b"d"])
    wait_until(lambda: len(script.requests) == 6, 10, "sent")
    failing = queued(acks, script, [[b"e"], [b"f"]])
    script.answer(5)
    script.answer(6, Unavailable("UNAVAILABLE", "no leader"))
    assert first.answer() == [True]
    assert all(c.answer() is None and isinstance(c.error, Unavailable) for c in failing)
    assert len(script.requests) == 7, "an error that may be the cluster's is not retried one by one"
    assert acks.queue.idle()


def test_settled_each_reads_the_response_and_an_older_servers_count_in_order() -> None:
    assert settled_each(2, [1, 3], 4) == [True, False, True, False]
    assert settled_each(3, [], 3) == [True, True, True]
    assert settled_each(1, [], 3) == [True, False, False], "no list (an older server): the count in order"
    assert settled_each(1, [7, 0], 3) == [True, False, False], "an index out of range: the count in order"
    assert settled_each(9, [], 2) == [True, True]
