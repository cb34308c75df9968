"""PreVote: a follower restarted again and again under publish load never deposes the healthy leader
(the term never moves); with PreVote switched off the same restarts do."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from broker.client import Client
from broker.devcluster import DevCluster
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster]

RESTARTS = 20
# The window in which a restarted follower hears only the other follower lasts until the leader dials
# it again. With pysyncobj's 1 s a restart that opens its journal at once (it no longer reads it all
# back) outwaits it only now and then: 20 restarts without PreVote once left the term unchanged (CI,
# 2026-12-04). At 3 s the window outlasts the longest election timeout (0.8 s) in most restarts, so
# PreVote has something to stop in nearly every one and the control without it deposes the leader.
RETRY = {"RAFTBROKER_RAFT_CONNECTION_RETRY_S": "3.0"}


class Publisher:
    """Publishes small batches in a loop from a thread until stopped; counts what was acknowledged."""

    def __init__(self, client: Client, topic: str) -> None:
        self.acked = 0
        self.error: BaseException | None = None
        self._client = client
        self._topic = topic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        try:
            while not self._stop.is_set():
                self._client.publish_batch(self._topic, [b"r%d-%d" % (n, i) for i in range(20)])
                self.acked += 20
                n += 1
        except BaseException as exc:  # reported by stop()
            self.error = exc

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def leader_term(c: DevCluster) -> tuple[int, int]:
    """(leader index, its term), once every running node agrees on the leader."""
    def agreed() -> tuple[int, int] | None:
        leader = c.leader()
        info = c.node_status(leader) if leader is not None else None
        return (leader, info.term) if leader is not None and info is not None else None
    found = wait_until(agreed, 30, "every running node to agree on a leader")
    assert isinstance(found, tuple)
    return found


def lead_from_the_top(c: DevCluster) -> None:
    """Hand leadership over until the node with the greatest Raft address leads."""
    top = max(range(c.nodes), key=c.raft_address)
    for _ in range(10):
        leader, _ = leader_term(c)
        if leader == top:
            return
        c.kill(leader, signal.SIGTERM)  # a stopping leader hands leadership over
        def handed_over(old: int = leader) -> bool:
            return c.leader() not in (None, old)

        def back(old: int = leader) -> bool:
            return c.node_status(old) is not None

        wait_until(handed_over, 30, "another node to lead")
        c.spawn(leader)
        wait_until(back, 30, "the old leader to come back")
    raise AssertionError("could not move leadership to the top address")


def restart_follower(c: DevCluster, times: int, stop_on_new_term: bool,
                     follower_env: dict[str, str] | None = None) -> tuple[int, int, int]:
    """kill -9 and respawn one follower ``times`` times under publish load, with ``follower_env``
    added to its environment; wait after each restart until it follows the leader again. Returns
    (first term, last term, restarts done)."""
    # pysyncobj connects only from the greater address to the smaller. With the leader on top, the
    # middle node reconnects to the bottom one at once but waits for the leader's retry (RETRY): the
    # window in which stock pysyncobj campaigns, hearing only the other follower.
    lead_from_the_top(c)
    leader, first_term = leader_term(c)
    follower = sorted(range(c.nodes), key=c.raft_address)[1]
    c.env_by_node[follower] = dict(follower_env or {})
    term = first_term
    done = 0
    with Client(c.addresses, retry_deadline_s=60) as client:
        client.create_topic("prevote")
        with Publisher(client, "prevote") as publisher:
            wait_until(lambda: publisher.acked >= 100, 30, "the publisher to get going")
            while done < times:
                done += 1
                c.kill(follower)
                c.spawn(follower)
                wait_until(lambda: (st := c.node_status(follower)) is not None and st.leader_id != "", 30,
                           "the restarted follower to hear a leader")
                _, term = leader_term(c)
                if term != first_term and stop_on_new_term:
                    break
            acked_before = publisher.acked
            wait_until(lambda: publisher.acked > acked_before, 30, "the publisher to go on after the restarts")
        assert publisher.error is None, publisher.error
    print(f"{done} follower restarts: term {first_term} -> {term}, leader n{leader + 1}")
    return first_term, term, done


@pytest.mark.timeout(240)
def test_restarting_a_follower_twenty_times_never_changes_the_term(tmp_path: Path) -> None:
    c = DevCluster(3, tmp_path, env=dict(os.environ, **RETRY)).start()
    try:
        c.wait_ready(60)
        first, last, done = restart_follower(c, RESTARTS, stop_on_new_term=False)
        assert done == RESTARTS
        assert last == first, f"the term moved from {first} to {last}: a restarted follower forced an election"
    finally:
        c.stop()


@pytest.mark.timeout(240)
def test_without_prevote_a_restarting_follower_deposes_the_leader(tmp_path: Path) -> None:
    # Only the restarted follower runs without PreVote: the handovers that put the leader on top
    # restart nodes too, and without PreVote those restarts moved leadership about at random (CI
    # rehearsal, 2026-12-04: ten handovers never reached the top). How a node answers a real vote
    # request does not depend on PreVote, so the control differs from the test in the one campaigner.
    c = DevCluster(3, tmp_path, env=dict(os.environ, **RETRY)).start()
    try:
        c.wait_ready(60)
        first, last, done = restart_follower(c, RESTARTS, stop_on_new_term=True,
                                             follower_env={"RAFTBROKER_PYSYNCOBJ_PATCHES_OFF": "prevote"})
        assert last > first, f"{done} restarts without PreVote left the term at {first}"
    finally:
        c.stop()
