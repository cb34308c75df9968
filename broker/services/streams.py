"""Server streams that hold no thread while idle (issue 11 item 5).

The gRPC server is a ``grpc.aio`` server. Unary handlers keep their sync code and run on the
server's call pool (``migration_thread_pool``), except ``Publish`` (a coroutine). A streaming
handler is a coroutine that drives a core *step generator* (``broker.leader.reading``): each step
(one bounded read) runs on the small read pool; when the generator yields
:class:`~broker.leader.reading.Idle`, the coroutine awaits :class:`ChangeFeed` (the state machine's
change signal carried into the event loop) without any thread. So 1,000 idle subscribers cost 1,000
coroutines, not 1,000 threads, and unary calls and health checks keep their own pool.

Limits: at most ``streams_max`` streams (``Subscribe`` and ``PublishStream``) are open on a node at
once; one more is refused with RESOURCE_EXHAUSTED before it does anything. Stream reads share
``read_threads`` threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from broker.core.errors import ResourceExhausted
from broker.core.state_machine import BrokerStateMachine
from broker.leader.packed_reads import PackedBatch
from broker.leader.reading import Idle
from broker.v1 import broker_pb2

log = logging.getLogger(__name__)

STREAMS_MAX = 4096  # open server streams per node; one more gets RESOURCE_EXHAUSTED
READ_THREADS = 8  # threads that run stream steps (reads), shared by every stream of a node

# A response of at most this many bytes lets a tailing stream's next step run on the event loop
# (``StreamRuntime.serve``, ``tail_on_loop``): about what one apply of small publishes adds.
TAIL_ON_LOOP_BYTES_MAX = 64 * 1024

T = TypeVar("T")
_END = object()


def small_response(step: object) -> bool:
    """Whether a stream's response is small enough to keep its next step on the event loop: a
    packed batch of at most :data:`TAIL_ON_LOOP_BYTES_MAX` bytes, or an event (no records)."""
    if isinstance(step, PackedBatch):
        return len(step.data) <= TAIL_ON_LOOP_BYTES_MAX
    return isinstance(step, broker_pb2.SubscribeResponse) and step.HasField("event")


class ChangeFeed:
    """The state machine's version, observable from the event loop: a change listener
    (``BrokerStateMachine.add_change_listener``) wakes the loop with ``call_soon_threadsafe`` after a
    change, when a stream waits for one. It runs on the thread that made the change (the apply's,
    mostly) and holds no thread of its own: until 2026-11-29 a thread waited on the state's
    condition and cost every node two context switches per apply, streams or not (bench/NOTE.md)."""

    def __init__(self, state: BrokerStateMachine) -> None:
        self._state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Future[None] | None = None
        self.loop_wakes = 0  # wake-ups asked of the event loop (tests, diagnostics)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._state.add_change_listener(self._on_change)

    def stop(self) -> None:
        self._state.remove_change_listener(self._on_change)

    def _on_change(self) -> None:
        """After a change, on the changing thread. Wakes the loop only when a stream waits (every
        apply bumps the version; a node without idle streams, a follower say, would wake its event
        loop for nothing). ``wait`` arms the future before it reads the version, and the version moved
        before this runs, so a change that ``wait`` has not seen finds the future armed here."""
        loop = self._loop
        if self._changed is None or loop is None:
            return
        self.loop_wakes += 1
        with contextlib.suppress(RuntimeError):  # the loop closed under us: the server is gone
            loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    async def wait(self, seen_version: int, timeout_s: float) -> None:
        """Return once the state's version differs from ``seen_version`` or after ``timeout_s``."""
        if self._changed is None:  # armed before the version is read: see _pump
            self._changed = asyncio.get_running_loop().create_future()
        if self._state.version != seen_version:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._changed), timeout_s)


class StreamRuntime:
    """What streaming handlers share on one node: the change feed, the read pool, the call pool
    (also the server's pool for unary handlers) and the cap on open streams."""

    def __init__(self, state: BrokerStateMachine, *, streams_max: int = STREAMS_MAX,
                 read_threads: int = READ_THREADS, call_threads: int = 64) -> None:
        if streams_max < 1 or read_threads < 1 or call_threads < 1:
            raise ValueError(f"streams_max ({streams_max}), read_threads ({read_threads}) and "
                             f"call_threads ({call_threads}) must be at least 1")
        self.streams_max = streams_max
        self.feed = ChangeFeed(state)
        self.read_pool = ThreadPoolExecutor(read_threads, thread_name_prefix="stream-read")
        self.call_pool = ThreadPoolExecutor(call_threads, thread_name_prefix="grpc")
        self._open = 0

    @property
    def open_streams(self) -> int:
        return self._open

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.feed.start(loop)

    def stop(self) -> None:
        """After the server stopped: end the pump, let running steps finish, free the pools."""
        self.feed.stop()
        self.read_pool.shutdown(wait=True)
        self.call_pool.shutdown(wait=True)

    def admit(self) -> None:
        """Count one more open stream (event-loop thread only); RESOURCE_EXHAUSTED past the cap."""
        if self._open >= self.streams_max:
            raise ResourceExhausted(f"this node serves at most {self.streams_max} streams at once; "
                                    "retry later or on another node")
        self._open += 1

    def release(self) -> None:
        assert self._open > 0
        self._open -= 1

    async def call(self, fn: Callable[[], T]) -> T:
        """Run blocking ``fn`` (a publish's checks against a schema, say) on the call pool."""
        return await asyncio.wrap_future(self.call_pool.submit(fn))

    async def serve(self, open_steps: Callable[[Callable[[], bool]], Iterator[object]], *,
                    read_ahead: bool = False,
                    tail_on_loop: Callable[[object], bool] | None = None) -> AsyncIterator[object]:
        """Drive the step generator ``open_steps(is_active)`` (opened on the read pool, so its
        validation errors raise here before anything is sent): yield its responses, await its
        idles. ``read_ahead``: the next step is read while a response is being sent (one step
        ahead, no more), so reading and sending overlap; only for steps that a reader may take and
        drop at no cost (a stateless read; not a group's, whose steps lease what they deliver).

        ``tail_on_loop``: for steps that only read this node's state (no filter to evaluate, no
        lease to submit), a stream following the tail runs its steps on the event loop instead of
        the read pool. A step runs here after a wait (a change, or the idle timeout), and after a
        response for which ``tail_on_loop(response)`` is true (a small one: what one apply added);
        after any other response the stream goes back to the pool, with ``read_ahead``, until it
        next waits. A tail step reads what the last applies added, a few records, which costs less
        than the two thread hand-offs of a step on the pool, and those came after every apply: on 3
        nodes at 2,000 records/s they added 0.5-0.6 ms to every publish's ack at p50 while a
        subscriber tailed the topic on the leader (bench/NOTE.md, 2026-12-05). A catch-up read of
        full responses stays on the pool.

        The stream counts against :attr:`streams_max` while it is open."""
        self.admit()
        active = True
        running: Future[object] | None = None
        steps: Iterator[object] | None = None
        try:
            opened: Future[Iterator[object]] = self.read_pool.submit(open_steps, lambda: active)
            steps = await asyncio.wrap_future(opened)
            running = self.read_pool.submit(next, steps, _END)
            while True:
                if running is None:  # a tail step, here on the loop
                    step = next(steps, _END)
                else:
                    step = await asyncio.wrap_future(running)
                    running = None
                if step is _END:
                    return
                if isinstance(step, Idle):
                    await self.feed.wait(step.seen_version, step.timeout_s)
                    if tail_on_loop is None:
                        running = self.read_pool.submit(next, steps, _END)
                elif tail_on_loop is not None and tail_on_loop(step):
                    yield step  # and the next step runs here
                elif read_ahead:
                    running = self.read_pool.submit(next, steps, _END)
                    yield step
                else:
                    yield step
                    running = self.read_pool.submit(next, steps, _END)
        finally:
            active = False
            self.release()
            if steps is not None:
                self._close_later(steps, running)

    def _close_later(self, steps: Iterator[object], running: Future[object] | None) -> None:
        """Close ``steps`` (runs its ``finally`` blocks) once no step of it is running."""
        close = getattr(steps, "close", None)
        if close is None:
            return

        def submit_close(_: object = None) -> None:
            try:
                self.read_pool.submit(close)
            except RuntimeError:  # the pool is shut down: close in this thread
                close()

        if running is None or running.done():
            submit_close()
        else:
            running.add_done_callback(submit_close)
