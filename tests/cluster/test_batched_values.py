"""One stored value per applied batch, through the real gRPC API on a 3-node cluster: publishes of
odd sizes (one above the stored-value cap), Subscribe and point reads from every offset, a prune
inside a batch, and a restart of every node reading the same from their stores (own cluster)."""

from __future__ import annotations

import time

import pytest

from broker.client import Client, Event, MissingRange, Record
from broker.core import record_log
from broker.devcluster import DevCluster
from broker.storage.rocks import RocksStore
from tests.record_store import stored_values

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
CAP = record_log.STORED_BATCH_RECORDS_MAX
SIZES = (1, 7, 1000, CAP + 1)
PRUNE_AT = 500  # inside the 1000-record batch (offsets 8..1007)


def value_of(i: int) -> bytes:
    return b"r%d-" % i + b"x" * (i % 41)


def check_every_offset(client: Client, values: list[bytes], start: int) -> None:
    """Subscribe from every offset in ``[start, end)`` (two records each, across value boundaries),
    point-read the offsets around every value boundary and every 17th (each read is one RPC: all
    of them would double the test's time), then one stream of the whole partition."""
    end = len(values)
    edges = {b + d for b in (1, 8, 1008, 1008 + CAP) for d in (-2, -1, 0, 1)}
    for o in range(start, end):
        got: list[Record] = []
        with client.subscribe("bv", partition=0, start=o, stop_at_end=True, max_batch=2) as items:
            for item in items:
                assert isinstance(item, Record), f"from {o}: {item}"
                got.append(item)
                if len(got) == 2:
                    break
        assert [(r.offset, r.value) for r in got] == [(i, values[i]) for i in range(o, min(o + 2, end))]
        if o not in edges and o % 17:
            continue
        [point] = list(client.read_range("bv", 0, o, o + 1))
        assert isinstance(point, Record) and (point.offset, point.value) == (o, values[o])
    whole = list(client.read_range("bv", 0, start, end))
    assert [(r.offset, r.value) for r in whole if isinstance(r, Record)] == [(i, values[i]) for i in range(start, end)]


def wait_converged(c: DevCluster) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every node applied everything before they stop
        views = [c.node_status(i) for i in range(c.nodes)]
        if all(v is not None for v in views) and len({v.applied_index for v in views if v}) == 1:
            return
        time.sleep(0.1)
    raise AssertionError("the nodes did not converge within 60 s")


def test_batches_of_odd_sizes_read_from_every_offset_prune_inside_and_restart(fresh_cluster: DevCluster) -> None:
    c = fresh_cluster
    values: list[bytes] = []
    with Client(c.addresses, retry_deadline_s=60) as client:
        client.create_topic("bv", 2)
        tid = client.describe_topic("bv").incarnation
        for n in SIZES:
            batch = [value_of(len(values) + i) for i in range(n)]
            results = client.publish_batch("bv", [{"value": v, "partition": 0} for v in batch])
            assert [r.offset for r in results] == list(range(len(values), len(values) + n))
            values += batch
        check_every_offset(client, values, 0)
        assert client.prune("bv", PRUNE_AT, partition=0) == PRUNE_AT
        items = list(client.read_range("bv", 0, 0, len(values)))
        assert items[0] == MissingRange("bv", 0, 0, PRUNE_AT, "skip_forward")
        assert [r.offset for r in items[1:] if isinstance(r, Record)] == list(range(PRUNE_AT, len(values)))
        wait_converged(c)
    c.stop()
    for i in range(c.nodes):  # the straddling value stays; the ones wholly before the cut are gone
        store = RocksStore(c.node_data_dir(i) / "store")
        try:
            assert stored_values(store, tid, 0) == [(8, 1000), (1008, CAP), (1008 + CAP, 1)], f"node {i}"
        finally:
            store.close()
    c.start()
    c.wait_ready(60)
    with Client(c.addresses, retry_deadline_s=60) as client:
        described = client.describe_topic("bv").partitions[0]
        assert (described.start_offset, described.end_offset) == (PRUNE_AT, len(values))
        with client.subscribe("bv", partition=0, start=0, stop_at_end=True) as stream:
            first = next(iter(stream))
        assert isinstance(first, Event) and first.type == "skip_forward"
        check_every_offset(client, values, PRUNE_AT)
