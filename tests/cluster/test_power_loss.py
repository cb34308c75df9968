"""Whole-cluster crashes at random (seeded, printed) points while the SDK publishes (SPEC §2.1, §9).

Power loss is simulated (``RAFTBROKER_SIMULATE_POWER_LOSS=1``): a restarted node cuts its Raft
journal back to what it had fsynced and deletes its RocksDB store, so it rebuilds from its fsynced
snapshot and journal. ``fsync`` topics keep every acknowledged record, once, in order; with the
journal's syncs switched off the same drill loses acknowledged records (the test has teeth).
``disk`` topics keep everything through kill -9 of every node (a process crash, no power loss).
Set ``RAFTBROKER_CRASH_SEED`` to replay a schedule.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.client import Client, TopicNotFound
from broker.devcluster import DevCluster
from broker.replication.journal import JOURNAL_DIR_NAME, segment_sequences
from tests.cluster.digests import digest, partition_contents, wait_converged
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster]

PARTITIONS = 2
BATCH = 20
TOPIC = "crash"


@dataclass
class Outcome:
    acked: dict[int, list[bytes]] = field(default_factory=lambda: {p: [] for p in range(PARTITIONS)})
    missing: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    replicas_differ: bool = False
    journals_reopened: int = 0  # restarts that cut their journal back to the last fsync
    journals_cut: int = 0  # ...of which found unsynced bytes to drop
    restores_logged: int = 0
    topic_lost: int = 0  # publishes that found the topic gone (its creation was lost)


class Publisher:
    """One SDK client publishing numbered batches, alternating partitions, until stopped."""

    def __init__(self, client: Client, outcome: Outcome, durability: str) -> None:
        self.outcome = outcome
        self._durability = durability
        self.count = 0
        self.error: BaseException | None = None
        self._client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        b = 0
        try:
            while not self._stop.is_set():
                p = b % PARTITIONS
                values = [b"%d-%d" % (b, i) for i in range(BATCH)]
                try:
                    results = self._client.publish_batch(TOPIC, [{"value": v, "partition": p} for v in values])
                except TopicNotFound:  # the topic itself was lost: count it, create it again, go on
                    self.outcome.topic_lost += 1
                    self._client.create_topic(TOPIC, partitions=PARTITIONS, durability=self._durability)
                    continue
                assert [r.partition for r in results] == [p] * BATCH
                self.outcome.acked[p].extend(values)
                self.count += BATCH
                b += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)


def crash_everything(c: DevCluster, rng: random.Random, publisher: Publisher, round_: int) -> None:
    """kill -9 every node, each at its own random point in the next ~0.4 s, then restart them all."""
    order = rng.sample(range(c.nodes), c.nodes)
    delays = [round(rng.uniform(0.0, 0.2), 3) for _ in order]
    print(f"round {round_}: {publisher.count} acked; kill n{[i + 1 for i in order]} after {delays} s")
    for i, delay in zip(order, delays, strict=True):
        time.sleep(delay)
        c.kill(i)
    for i in range(c.nodes):
        c.spawn(i)


def check(c: DevCluster, outcome: Outcome) -> None:
    """Compare every node's partitions with what was acknowledged."""
    wait_converged(c, 120)
    for p in range(PARTITIONS):
        contents = [partition_contents(c.grpc_address(i), TOPIC, p) for i in range(c.nodes)]
        outcome.replicas_differ |= len({digest(x) for x in contents}) != 1
        stored = [v for _, v in contents[0]]
        positions: dict[bytes, int] = {}
        for index, value in enumerate(stored):
            outcome.duplicates += value in positions
            positions.setdefault(value, index)
        found = [positions[v] for v in outcome.acked[p] if v in positions]
        outcome.missing += len(outcome.acked[p]) - len(found)
        outcome.out_of_order += sum(1 for a, b in zip(found, found[1:], strict=False) if b < a)
    logs = [c.log_path(i).read_text() for i in range(c.nodes)]
    cuts = [line for text in logs for line in text.splitlines() if "power-loss simulation: " in line]
    outcome.journals_reopened = len(cuts)
    outcome.journals_cut = sum(1 for line in cuts if "(dropped 0 bytes)" not in line)
    outcome.restores_logged = sum(text.count("restored snapshot at index") for text in logs)


CrashRound = Callable[[DevCluster, "Publisher", int], None]


def drill(tmp_path: Path, durability: str, rounds: int, env: dict[str, str],
          crash_round: CrashRound | None = None) -> Outcome:
    """Publish to a ``durability`` topic through ``rounds`` whole-cluster crashes; check the result.
    ``crash_round(cluster, publisher, round)`` waits for its moment, kills every node and starts
    them again (default: each node killed at its own seeded random point, :func:`crash_everything`)."""
    seed = int(os.environ.get("RAFTBROKER_CRASH_SEED", random.randrange(1 << 32)))
    print(f"crash schedule seed {seed} (RAFTBROKER_CRASH_SEED={seed} replays it)")
    rng = random.Random(seed)

    def at_random_points(c: DevCluster, publisher: Publisher, round_: int) -> None:
        target = publisher.count + rng.randrange(200, 3000, BATCH)
        wait_until(lambda: publisher.count >= target or publisher.error, 60,
                   "the publisher to reach the crash point")
        crash_everything(c, rng, publisher, round_)

    crash = crash_round or at_random_points
    c = DevCluster(3, tmp_path, env={**os.environ, **env}).start()
    outcome = Outcome()
    try:
        c.wait_ready(60)
        with Client(c.addresses, retry_deadline_s=120, no_quorum_grace_s=60) as client:  # rides out restarts
            client.create_topic(TOPIC, partitions=PARTITIONS, durability=durability)
            publisher = Publisher(client, outcome, durability)
            publisher.start()
            try:
                for round_ in range(1, rounds + 1):
                    crash(c, publisher, round_)
                    c.wait_ready(60)
                after = publisher.count
                wait_until(lambda: publisher.count >= after + 200 or publisher.error, 120,
                           "the publisher to go on after the last crash")
            finally:
                publisher.stop()
            assert publisher.error is None, f"publisher failed: {publisher.error!r}"
        check(c, outcome)
    finally:
        c.stop()
    acked = sum(len(v) for v in outcome.acked.values())
    print(f"{durability}: {acked} acked, {outcome.missing} missing, {outcome.duplicates} duplicates, "
          f"topic lost {outcome.topic_lost} times, "
          f"{outcome.out_of_order} out of order, replicas differ: {outcome.replicas_differ}; logs: "
          f"{outcome.journals_reopened} journals reopened as after a power loss, {outcome.journals_cut} of them "
          f"with unsynced bytes dropped, {outcome.restores_logged} snapshot restores")
    return outcome


def assert_nothing_lost(outcome: Outcome) -> None:
    assert outcome.topic_lost == 0, "the topic was lost"
    assert outcome.missing == 0, f"{outcome.missing} acknowledged records lost"
    assert outcome.duplicates == 0, f"{outcome.duplicates} records stored twice"
    assert outcome.out_of_order == 0, "acknowledged records out of order"
    assert not outcome.replicas_differ, "replicas differ"


# Frequent compactions: restarted nodes rebuild their deleted store from a snapshot plus the journal.
POWER_LOSS = {"RAFTBROKER_SIMULATE_POWER_LOSS": "1", "RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES": "50"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("journal_writes", ["default", "direct"])
def test_fsync_topic_keeps_every_acknowledged_record_through_power_losses(tmp_path: Path, journal_writes: str) -> None:
    """``direct``: every journal record past a segment's first block is written with O_DIRECT (by
    default only records of 64 KiB and more are, and this drill's batches are smaller)."""
    env = dict(POWER_LOSS)
    if journal_writes == "direct":
        env["RAFTBROKER_RAFT_JOURNAL_DIRECT_WRITE_MIN_BYTES"] = "1"
    outcome = drill(tmp_path, "fsync", rounds=3, env=env)
    assert_nothing_lost(outcome)
    logs = "".join((tmp_path / name).read_text() for name in os.listdir(tmp_path) if name.endswith(".log"))
    assert "O_DIRECT refused" not in logs
    assert outcome.journals_reopened == 3 * 3, "every restart must cut its journal back as after a power loss"
    assert outcome.restores_logged > 0, "no node rebuilt its store from a snapshot"


@pytest.mark.timeout(300)
def test_without_journal_syncs_power_losses_lose_acknowledged_records(tmp_path: Path) -> None:
    # No early compactions here: a compaction that deletes journal segments is a sync point of its own.
    env = {"RAFTBROKER_SIMULATE_POWER_LOSS": "1", "RAFTBROKER_PYSYNCOBJ_PATCHES_OFF": "journal_sync"}
    outcome = drill(tmp_path, "fsync", rounds=1, env=env)
    lost = outcome.missing + outcome.topic_lost
    assert lost > 0, "acknowledged records survived without fsync: the drill has no teeth"


@pytest.mark.timeout(300)
def test_disk_topic_keeps_every_acknowledged_record_through_kill9_of_every_node(tmp_path: Path) -> None:
    outcome = drill(tmp_path, "disk", rounds=3, env={"RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES": "300"})
    assert_nothing_lost(outcome)


def _oldest_segment(c: DevCluster, i: int) -> int:
    """The sequence of node ``i``'s oldest journal segment: a compaction that has passed every entry
    of a segment deletes it (the dropped prefix is gone for good)."""
    found = segment_sequences(c.node_data_dir(i) / "raft" / JOURNAL_DIR_NAME)
    return found[0] if found else -1


@pytest.mark.timeout(300)
def test_kill9_of_every_node_right_after_a_log_compaction_loses_nothing(tmp_path: Path) -> None:
    """A compaction drops the journal's prefix once the snapshot covering it is durable; a node that
    restarts then needs the store or that snapshot for everything before it (and, as applies are
    written without RocksDB's WAL, ``journaled=True``, the snapshot's flush of the store). The
    riskiest moment is the one right after the prefix is gone: each round kills every node the
    moment one of them has deleted a journal segment (small segments, so that compactions pass
    whole ones), then checks that every acknowledged record is there once, in order, on every node."""
    def right_after_a_compaction(c: DevCluster, publisher: Publisher, round_: int) -> None:
        before = [_oldest_segment(c, i) for i in range(c.nodes)]
        compacted = wait_until(
            lambda: [c.node_id(i) for i in range(c.nodes) if _oldest_segment(c, i) > before[i]] or publisher.error,
            120, "a node's compaction to delete a journal segment")
        for i in range(c.nodes):
            c.kill(i)
        print(f"round {round_}: {publisher.count} acked; {compacted} compacted: killed every node")
        for i in range(c.nodes):
            c.spawn(i)

    env = {"RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES": "300", "RAFTBROKER_RAFT_JOURNAL_SEGMENT_BYTES": "65536"}
    outcome = drill(tmp_path, "disk", rounds=3, env=env, crash_round=right_after_a_compaction)
    assert sum(len(v) for v in outcome.acked.values()) > 0
    assert_nothing_lost(outcome)
