"""Damaged data on a real node is reported, never a silent hang (issue 11, item 7): a flipped SST
block gives the reader a DATA_LOSS error naming the partition (and the node log names the file), a
garbage Raft snapshot halts the node and its reads fail with UNAVAILABLE instead of serving stale
data, and a damaged store CURRENT or Raft journal segment makes the node refuse to start with a message
saying what to do."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.client import Client, Record
from broker.client.errors import BrokerError, Unavailable
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

READ_BOUND_S = 60.0  # the reader must get an answer within this (a hang fails the test, not the run)


@pytest.fixture
def single(tmp_path: Path) -> Iterator[DevCluster]:
    """One node (always the leader: the SDK reads from it)."""
    cluster = DevCluster(1, tmp_path / "c")
    cluster.start()
    try:
        cluster.wait_ready(90)
        yield cluster
    finally:
        cluster.stop()


def _read_all(cluster: DevCluster, topic: str, retry_deadline_s: float = 30.0) -> tuple[list[Record], Exception | None]:
    """Subscribe from the start to the end in a thread; fail if it does not finish in time."""
    got: list[Record] = []
    outcome: list[Exception | None] = []

    def run() -> None:
        try:
            with Client(cluster.addresses, retry_deadline_s=retry_deadline_s) as client:
                got.extend(r for r in client.subscribe(topic, stop_at_end=True) if isinstance(r, Record))
            outcome.append(None)
        except Exception as exc:  # noqa: BLE001 (handed to the test)
            outcome.append(exc)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(READ_BOUND_S)
    assert not reader.is_alive(), f"the reader hung for {READ_BOUND_S:g} s after {len(got)} records"
    return got, outcome[0]


def _store_files(cluster: DevCluster, pattern: str) -> list[Path]:
    return sorted((cluster.node_data_dir(0) / "store").glob(pattern))


def test_a_damaged_sst_block_gives_the_reader_a_data_loss_error_naming_partition_and_file(
        single: DevCluster) -> None:
    with Client(single.addresses, retry_deadline_s=30) as client:
        client.create_topic("damaged", 1)
        for start in range(0, 20_000, 1000):
            values = [f"record-{i:06d}-" + os.urandom(90).hex() for i in range(start, start + 1000)]  # incompressible
            client.publish_batch("damaged", values)
    single.kill(0, signal.SIGTERM)  # a clean stop flushes the memtables into SST files
    sst = max(_store_files(single, "db-*/*.sst"), key=lambda p: p.stat().st_size)
    size = sst.stat().st_size
    assert size > 500_000, f"expected a large records SST, got {sst} of {size} bytes"
    with open(sst, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 256)
    single.spawn(0)
    single.wait_ready(90)

    got, error = _read_all(single, "damaged")
    assert isinstance(error, BrokerError) and error.code == "DATA_LOSS", f"got {error!r} after {len(got)} records"
    assert "topic damaged partition 0" in str(error) and "another node" in str(error)
    assert 0 < len(got) < 20_000 and [r.offset for r in got] == list(range(len(got))), "records before the damage"
    wait_until(lambda: sst.name in single.log_path(0).read_text(errors="replace"), 10, "the log to name the file")
    log = single.log_path(0).read_text(errors="replace")
    assert "topic damaged partition 0" in log and "Traceback" not in log
    assert single.alive(0)


def test_a_garbage_raft_snapshot_halts_the_node_and_reads_fail_unavailable(single: DevCluster) -> None:
    with Client(single.addresses, retry_deadline_s=30) as client:
        client.create_topic("stale", 1)
        client.publish_batch("stale", [f"m{i}" for i in range(50)])
    single.kill(0, signal.SIGTERM)
    (single.node_data_dir(0) / "raft" / "raft.snapshot").write_bytes(os.urandom(4096))
    single.spawn(0)
    wait_until(lambda: "raft halted on this node" in single.log_path(0).read_text(errors="replace"), 60,
               "the node to log the halt")
    assert single.alive(0), "the process stays up (health reports the halt: H4)"

    got, error = _read_all(single, "stale", retry_deadline_s=5)
    assert got == [], "a halted node serves no stale records"
    assert isinstance(error, Unavailable) and "Raft has halted" in str(error), repr(error)


def _restart_refused(cluster: DevCluster, damage: str) -> str:
    """Start node 0 again; it must refuse: exit code 3, no traceback. Returns its log."""
    cluster.spawn(0)
    proc = cluster.procs[0]
    assert proc is not None
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the node started with {damage}")
    log = cluster.log_path(0).read_text(errors="replace")
    assert code == 3, log[-2000:]
    assert "Traceback" not in log, log[-2000:]
    return log


@pytest.mark.parametrize("content", [b"\x00\xffgarbage", b"7"])
def test_a_damaged_store_current_refuses_to_start_naming_the_file(tmp_path: Path, content: bytes) -> None:
    cluster = DevCluster(1, tmp_path / "c")
    cluster.start()
    try:
        cluster.wait_ready(90)
        cluster.kill(0, signal.SIGTERM)
        current = cluster.node_data_dir(0) / "store" / "CURRENT"
        current.write_bytes(content)
        log = _restart_refused(cluster, "a damaged store CURRENT")
        assert f"refusing to start: {current} is damaged" in log
        assert "move the store directory" in log
    finally:
        cluster.stop()


def test_a_damaged_raft_journal_refuses_to_start_naming_the_segment(tmp_path: Path) -> None:
    cluster = DevCluster(1, tmp_path / "c")
    cluster.start()
    try:
        cluster.wait_ready(90)
        with Client(cluster.addresses) as client:
            client.create_topic("j", partitions=1)
            client.publish_batch("j", [b"x" * 100] * 50)
        cluster.kill(0, signal.SIGTERM)
        segments = sorted((cluster.node_data_dir(0) / "raft" / "journal").glob("*.seg"))
        assert segments
        segment = segments[-1]
        data = bytearray(segment.read_bytes())
        data[9] ^= 0x01  # the segment's sequence, under the header's checksum
        segment.write_bytes(bytes(data))
        log = _restart_refused(cluster, "a damaged journal segment")
        assert f"refusing to start: {segment} is not a raftbroker journal segment" in log, log[-2000:]
        assert "move the node's data directory away" in log
    finally:
        cluster.stop()
