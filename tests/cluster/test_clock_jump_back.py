"""A leader clock that goes back by minutes (``RAFTBROKER_CLOCK_FILE``, every node of a real 3-node
cluster): a lease still expires and a nacked retry is still redelivered on time, and an idempotency
key inside its window is still refused (issue 12 item 3)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client, Message
from broker.devcluster import DevCluster
from tests.cluster.group_helpers import Log, run_member
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

JUMP_BACK_MS = 10 * 60 * 1000  # ten minutes: without the fixes, the lease and the retry wait this long
VISIBILITY_MS = 2000
RETRY_DELAY_MS = 1000


@pytest.fixture
def jumpable(tmp_path: Path) -> Iterator[tuple[DevCluster, Path]]:
    """A 3-node cluster whose nodes all follow one clock offset file."""
    clock_file = tmp_path / "clock_offset_ms"
    cluster = DevCluster(3, tmp_path / "cluster", env=dict(os.environ, RAFTBROKER_CLOCK_FILE=str(clock_file)))
    cluster.start()
    try:
        cluster.wait_ready(60)
        yield cluster, clock_file
    finally:
        cluster.stop()


def jump(cluster: DevCluster, clock_file: Path, offset_ms: int) -> None:
    """Set every node's clock offset and wait until each node's log says it took it."""
    clock_file.write_text(str(offset_ms))
    line = f"clock offset now {offset_ms:+d} ms"
    for i in range(3):
        def taken(i: int = i) -> bool:
            return line in cluster.log_path(i).read_text(errors="replace")

        wait_until(taken, 30, f"node {i} to take the offset {offset_ms}")


def test_lease_retry_and_dedup_keep_their_times_when_the_clock_goes_back(
        jumpable: tuple[DevCluster, Path]) -> None:
    cluster, clock_file = jumpable
    with Client(cluster.addresses, retry_deadline_s=30) as client:
        client.create_topic("cj", 1, dedup_window_ms=60_000)
        first = client.publish("cj", b"keyed", idempotency_key="k-1")
        client.publish("cj", b"nacked", idempotency_key="k-2")
        client.publish("cj", b"held", idempotency_key="k-3")
        held: list[Message] = []
        first_round = threading.Event()

        def handle(message: Message) -> None:
            if message.delivery_attempt > 1:
                message.ack()
            elif message.value == b"nacked":
                message.nack(delay_ms=RETRY_DELAY_MS)
            elif message.value == b"held":
                held.append(message)  # never settled: its lease must run out
            else:
                message.ack()
            if len(log.deliveries) >= 3:
                first_round.set()

        log, stop = Log(), threading.Event()
        member = run_member(client, "cj", "g", "only", log, stop, handle=handle,
                            visibility_timeout_ms=VISIBILITY_MS, base_delay_ms=RETRY_DELAY_MS)
        try:
            assert first_round.wait(60), "the first deliveries did not arrive"
            jump(cluster, clock_file, -JUMP_BACK_MS)
            jumped_at = time.monotonic()

            def redelivered(value: bytes) -> float | None:
                with log.lock:
                    again = [at for _, m, at in log.deliveries if m.value == value and m.delivery_attempt == 2]
                return again[0] if again else None

            # Generous for a busy machine, but far below the ten minutes the jump would add.
            nacked_at = wait_until(lambda: redelivered(b"nacked"), 90, "the nacked record redelivered")
            held_at = wait_until(lambda: redelivered(b"held"), 90, "the held record's lease to expire")
            assert isinstance(nacked_at, float) and isinstance(held_at, float)
            print(f"after the jump: nacked redelivered in {nacked_at - jumped_at:.2f} s, "
                  f"held lease expired and redelivered in {held_at - jumped_at:.2f} s")

            again = client.publish("cj", b"keyed", idempotency_key="k-1")
            assert again.duplicate, "an idempotency key inside its window was accepted again"
            assert (again.partition, again.offset) == (first.partition, first.offset)
        finally:
            stop.set()
            member.join(15)
