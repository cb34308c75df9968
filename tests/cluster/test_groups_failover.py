"""Consumer groups across a leader kill -9, and a corrupted record on disk (own cluster)."""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path

import pytest

from broker.client import Batch, Client, Event, GroupNotFound, Message, Unavailable
from broker.core import records
from broker.devcluster import DevCluster
from broker.storage.rocks import RocksStore
from tests.conftest import wait_until
from tests.record_store import flip_record_byte

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
TOTAL = 3000
MEMBERS = 3
IN_FLIGHT = 20


class Ledger:
    """Every delivery, and which acks the broker confirmed (and when)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deliveries: collections.Counter[bytes] = collections.Counter()
        self.confirmed: set[bytes] = set()
        self.frozen: set[bytes] | None = None  # acks confirmed before the kill


def member(addresses: list[str], ledger: Ledger, stop: threading.Event) -> None:
    with Client(addresses, retry_deadline_s=60) as client:
        consumer = client.subscribe("fo", group="heavy", max_in_flight=IN_FLIGHT, visibility_timeout_ms=5000)

        def close_on_stop() -> None:
            stop.wait()
            consumer.close()

        threading.Thread(target=close_on_stop, daemon=True).start()
        for item in consumer:
            if not isinstance(item, Message):
                continue
            with ledger.lock:
                ledger.deliveries[item.value] += 1
            item.ack()
            with ledger.lock:
                ledger.confirmed.add(item.value)


def test_leader_kill_during_heavy_consumption_loses_nothing_and_never_regresses(killable: DevCluster) -> None:
    addresses = killable.addresses
    with Client(addresses, retry_deadline_s=60) as admin:
        admin.create_topic("fo", 4)
        values = [b"v%05d" % i for i in range(TOTAL)]
        for start in range(0, TOTAL, 1000):
            admin.publish_batch("fo", values[start:start + 1000])
        ledger, stop = Ledger(), threading.Event()
        threads = [threading.Thread(target=member, args=(addresses, ledger, stop), daemon=True) for _ in range(MEMBERS)]
        for t in threads:
            t.start()
        committed_seen: list[list[int]] = []
        regressions: list[tuple[list[int], list[int]]] = []

        def watch() -> None:
            while not stop.is_set():
                try:
                    now = [p.committed for p in admin.groups.lag("fo", "heavy").partitions]
                except (Unavailable, GroupNotFound):
                    continue
                if committed_seen and any(a < b for a, b in zip(now, committed_seen[-1], strict=True)):
                    regressions.append((committed_seen[-1], now))
                committed_seen.append(now)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        wait_until(lambda: len(ledger.confirmed) >= TOTAL // 3, 60, "a third consumed before the kill")
        leader = killable.leader()
        assert leader is not None
        with ledger.lock:
            ledger.frozen = set(ledger.confirmed)
        killable.kill(leader)
        wait_until(lambda: len(ledger.deliveries) == TOTAL, 90, "every message delivered after the failover")
        wait_until(lambda: len(ledger.confirmed) == TOTAL, 30, "every message acknowledged")
        wait_until(lambda: admin.groups.lag("fo", "heavy").lag == 0, 30, "the group caught up")
        stop.set()
        for t in threads:
            t.join(15)
        watcher.join(5)
    assert set(ledger.deliveries) == set(values), "no message lost"
    duplicates = {v for v, n in ledger.deliveries.items() if n > 1}
    assert ledger.frozen is not None and not duplicates & ledger.frozen, "nothing settled was delivered again"
    assert len(duplicates) <= MEMBERS * IN_FLIGHT, "duplicates only for leases in flight at the kill"
    assert not regressions, f"committed positions went back: {regressions[:3]}"
    assert len(committed_seen) > 5
    killable.spawn(leader)
    wait_until(lambda: killable.leader() is not None, 60, "the cluster healed")


def test_badmsg_for_a_byte_flipped_in_every_store(killable: DevCluster) -> None:
    with Client(killable.addresses, retry_deadline_s=60) as client:
        client.create_topic("bad", 1)
        client.publish_batch("bad", [b"ok-0", b"broken", b"ok-2"])
        tid = client.describe_topic("bad").incarnation
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # every node applied the record before they stop
            views = [killable.node_status(i) for i in range(killable.nodes)]
            if all(v is not None for v in views) and len({v.applied_index for v in views if v}) == 1:
                break
            time.sleep(0.1)
    killable.stop()
    for i in range(killable.nodes):
        store = RocksStore(Path(killable.node_data_dir(i)) / "store")
        try:
            flip_record_byte(store, tid, 0, 1)  # the middle record of the stored batch, on every node
        finally:
            store.close()
    killable.start()
    killable.wait_ready(60)
    with Client(killable.addresses, retry_deadline_s=60) as client:
        stateless = list(client.subscribe("bad", stop_at_end=True))
        batched = list(client.subscribe_batches("bad", stop_at_end=True))
        consumer = client.subscribe("bad", group="readers", stop_at_end=True)
        items = []
        for item in consumer:
            items.append(item)
            if isinstance(item, Message):
                item.ack()
        consumer.close()
        dead = client.groups.dead_letters("bad", "readers")
    for seen in (stateless, items):
        events = [i for i in seen if isinstance(i, Event)]
        assert [(e.type, e.offset_before, e.offset_after) for e in events] == [("badmsg", 1, 2)]
        assert records.PositionToken.decode(events[0].position_after).next_offset == 2
        assert sorted(i.value for i in seen if not isinstance(i, Event)) == [b"ok-0", b"ok-2"]
    assert [(d.offset, d.reason.startswith("badmsg")) for d in dead] == [(1, True)]
    assert [(e.type, e.offset_before) for e in batched if isinstance(e, Event)] == [("badmsg", 1)]
    assert [(b.first_offset, b.values) for b in batched if isinstance(b, Batch)] == [(0, [b"ok-0"]), (2, [b"ok-2"])]
