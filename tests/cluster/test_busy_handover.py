"""A busy leader stopped gracefully (SIGTERM) hands leadership over while writers keep publishing, 20
times in a row: each hand-over is a transfer (not an election after a timeout), completes within
two election timeouts (plus a stated tolerance for measuring through gRPC on a busy machine), and
nothing acknowledged is lost (issue 12 item 2)."""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path

import pytest

from broker.client import BrokerError, Client
from broker.devcluster import DevCluster
from broker.replication.raft import RaftOptions
from tests.cluster.digests import digest, partition_contents, wait_converged
from tests.cluster.test_membership import TOPIC, Publisher, caught_up
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

ROUNDS = 20
ELECTION_TIMEOUT_S = RaftOptions().raft_max_timeout_s
# Observing the new leader costs a NodeStatus round trip to each node every 20 ms; on this shared
# 2-core machine one round took up to ~0.3 s under load. Stated tolerance: 0.5 s on top.
TOLERANCE_S = 0.5


class NamedPublisher(Publisher):
    """The membership test's publisher with its own value prefix (several run at once)."""

    def __init__(self, client: Client, name: str) -> None:
        super().__init__(client)
        self.name = name

    def _run(self) -> None:
        b = 0
        try:
            while not self._stop.is_set():
                values = [b"%s-%d-%d" % (self.name.encode(), b, i) for i in range(50)]
                batch = [{"value": v, "partition": 0, "idempotency_key": v.decode()} for v in values]
                try:
                    self._client.publish_batch(TOPIC, batch)
                except BrokerError as err:
                    if err.code != "CANCELLED":  # a stopping leader cancels calls in flight: retry
                        raise
                    self.cancelled += 1
                    continue
                self.acked.extend(values)
                b += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def new_leader_seen(c: DevCluster, old: int) -> int | None:
    for i in range(3):
        if i == old:
            continue
        status = c.node_status(i, timeout_s=0.5)
        if status is not None and status.leader_id == c.node_id(i):
            return i
    return None


def test_a_busy_leader_hands_over_twenty_times_within_two_election_timeouts(tmp_path: Path) -> None:
    c = DevCluster(3, tmp_path).start()
    handovers: list[float] = []
    try:
        c.wait_ready(60)
        with Client(c.addresses, retry_deadline_s=60) as client:
            client.create_topic(TOPIC)
            with NamedPublisher(client, "a") as publisher, NamedPublisher(client, "b") as second:
                publisher.wait_for_more(500)
                for _ in range(ROUNDS):
                    old = c.leader()
                    assert old is not None
                    started = time.monotonic()
                    c.kill(old, signal.SIGTERM)
                    wait_until(lambda old=old: new_leader_seen(c, old), 30, "a new leader")
                    handovers.append(time.monotonic() - started)
                    c.spawn(old)
                    wait_until(lambda old=old: c.leader() is not None and caught_up(c, old), 60,
                               "the old leader to rejoin")
                    publisher.wait_for_more(100)
            assert publisher.error is None and second.error is None, publisher.error or second.error
        logs = [c.log_path(i).read_text(errors="replace") for i in range(3)]
        transfers = sum(log.count("handed leadership over (now follower)") for log in logs)
        timed_out = sum(log.count("did not complete in time") for log in logs)
        wait_converged(c)
        contents = [partition_contents(c.grpc_address(i), TOPIC, 0) for i in range(3)]
        assert len({digest(x) for x in contents}) == 1, "replicas differ"
        stored = {v for _, v in contents[0]}
        acked = publisher.acked + second.acked
        missing = [v for v in acked if v not in stored]
        quantiles = statistics.quantiles(handovers, n=10)
        print(f"{ROUNDS} hand-overs under load: median {statistics.median(handovers):.3f} s, "
              f"p90 {quantiles[-1]:.3f} s, max {max(handovers):.3f} s (2 election timeouts: "
              f"{2 * ELECTION_TIMEOUT_S:.1f} s); {transfers} by transfer, {timed_out} transfers timed out; "
              f"{len(acked)} records acknowledged")
        assert not missing, f"{len(missing)} acknowledged records lost"
        assert transfers == ROUNDS, f"only {transfers} of {ROUNDS} hand-overs were transfers"
        slow = [round(h, 3) for h in handovers if h > 2 * ELECTION_TIMEOUT_S + TOLERANCE_S]
        assert not slow, f"hand-overs slower than 2 election timeouts + {TOLERANCE_S} s: {slow}"
    finally:
        c.stop()
