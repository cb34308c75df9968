"""A busy leader stopped gracefully (SIGTERM) hands leadership over while writers keep publishing, 20
times in a row: each hand-over is a transfer (not an election after a timeout), completes within
two election timeouts (plus a stated tolerance for measuring through gRPC on a busy machine), and
nothing acknowledged is lost (issue 12 item 2)."""

from __future__ import annotations

import datetime
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

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

ROUNDS = 20
ELECTION_TIMEOUT_S = RaftOptions().raft_max_timeout_s
# Seen from outside (SIGTERM sent -> another node answers NodeStatus as leader), a hand-over also
# includes the signal's delivery, the node's shutdown start and gRPC round trips to busy nodes,
# which took up to ~2 s on this shared 2-core machine: that bound is only reported, and held to a
# generous SEEN_MAX_S. The hand-over proper (writes held -> old leader steps down for the new
# leader's term, from the old leader's log) must fit in 2 election timeouts, no tolerance.
SEEN_MAX_S = 10.0


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


def new_leader_seen(c: DevCluster, old: int) -> bool:
    for i in range(3):
        if i == old:
            continue
        status = c.node_status(i, timeout_s=0.5)
        if status is not None and status.role == "leader":
            return True
    return False


_STAMP = "%Y-%m-%d %H:%M:%S,%f"


def transfer_durations(log: str) -> list[float]:
    """From one node's log: seconds from each transfer's start (writes held) to the node seeing the
    new leader's term and stepping down, as the node itself logged them."""
    started: datetime.datetime | None = None
    out = []
    for line in log.splitlines():
        if "broker.replication.transfer: leadership transfer to" in line:
            started = datetime.datetime.strptime(line[:23], _STAMP)
        elif "handed leadership over (now follower)" in line and started is not None:
            out.append((datetime.datetime.strptime(line[:23], _STAMP) - started).total_seconds())
            started = None
    return out


def describe(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"n={len(values)} min {ordered[0]:.3f} s, median {statistics.median(ordered):.3f} s, "
            f"p90 {p90:.3f} s, max {ordered[-1]:.3f} s")


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

                    def handed_over(old: int = old) -> bool:
                        return new_leader_seen(c, old)

                    def rejoined(old: int = old) -> bool:
                        return c.leader() is not None and caught_up(c, old)

                    wait_until(handed_over, 30, "a new leader")
                    handovers.append(time.monotonic() - started)
                    c.spawn(old)
                    wait_until(rejoined, 60, "the old leader to rejoin")
                    publisher.wait_for_more(100)
            assert publisher.error is None and second.error is None, publisher.error or second.error
        logs = [c.log_path(i).read_text(errors="replace") for i in range(3)]
        durations = [d for log in logs for d in transfer_durations(log)]
        transfers = len(durations)
        timed_out = sum(log.count("did not complete in time") for log in logs)
        wait_converged(c)
        contents = [partition_contents(c.grpc_address(i), TOPIC, 0) for i in range(3)]
        assert len({digest(x) for x in contents}) == 1, "replicas differ"
        stored = {v for _, v in contents[0]}
        acked = publisher.acked + second.acked
        missing = [v for v in acked if v not in stored]
        print(f"{ROUNDS} hand-overs under load; 2 election timeouts = {2 * ELECTION_TIMEOUT_S:.1f} s; "
              f"{transfers} by transfer, {timed_out} transfers timed out; {len(acked)} records acknowledged")
        print(f"  transfer (old leader's log): {describe(durations)}")
        print(f"  seen from outside (SIGTERM -> NodeStatus leader): {describe(handovers)}")
        assert not missing, f"{len(missing)} acknowledged records lost"
        assert transfers == ROUNDS, f"only {transfers} of {ROUNDS} hand-overs were transfers"
        slow = [round(d, 3) for d in durations if d > 2 * ELECTION_TIMEOUT_S]
        assert not slow, f"transfers slower than 2 election timeouts: {slow}"
        assert max(handovers) <= SEEN_MAX_S, f"a hand-over took {max(handovers):.2f} s seen from outside"
    finally:
        c.stop()
