"""A leader elected before it has applied what was committed in earlier terms says so (``leader_ready``).

After a whole-cluster crash every node restarts with the commit index its journal last wrote as a hint
(once a second, never synced), so the writes acknowledged in the last moments are in every journal but
applied nowhere. Raft learns they are committed only when the new leader's own first entry (the no-op
of its term) commits; until the state machine has applied that entry, the leader's state misses them.
A broker leader validating against that state reported a topic created earlier as missing (seen in
``tests/cluster/test_power_loss.py``). ``ReplicaStatus.leader_ready`` is what the broker's submitter
checks (``broker.leader.submitter.CommandSubmitter.ensure_leader``); this test drives real processes
through that window, with a slow state machine and rebuilt state so the window is wide.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from .cluster import Cluster, wait_until

pytestmark = pytest.mark.cluster

WRITES = 300
ROUNDS = 3  # the window is missed only if every node's hint was written after the last commit


def crash_and_rebuild(cluster: Cluster, apply_delay_ms: float) -> None:
    """kill -9 every node at once, drop every state machine (rebuilt from the journal) and restart."""
    cluster.kill_all()
    for node in cluster.nodes:
        shutil.rmtree(node.directory / "sm")
        node.apply_delay_ms = apply_delay_ms
    cluster.start()


@pytest.mark.timeout(300)
def test_a_leader_is_not_ready_until_it_applied_what_earlier_terms_committed(
        cluster_factory: Callable[..., Cluster]) -> None:
    cluster = cluster_factory()
    acknowledged = 0
    not_ready_seen = 0
    for round_ in range(ROUNDS):
        outcome = cluster.leader(timeout_s=60).request("submit", timeout_s=120, count=WRITES, prefix=f"r{round_}",
                                                       size=64)
        assert outcome["ok"] == WRITES, outcome
        acknowledged += WRITES
        crash_and_rebuild(cluster, apply_delay_ms=5)  # right after the acknowledgements
        observations: list[dict[str, Any]] = []

        def everything_applied(observations: list[dict[str, Any]] = observations,
                               acknowledged: int = acknowledged) -> bool:
            statuses = cluster.statuses()
            observations.extend(statuses.values())
            return len(statuses) == 3 and all(s["sm_applied"] > acknowledged for s in statuses.values())

        wait_until(everything_applied, 120, f"{acknowledged} writes applied on every node", interval_s=0.002)
        early = [s for s in observations if s["role"] == "leader" and s["leader_ready"]
                 and s["sm_applied"] < acknowledged]
        assert not early, f"a leader said it was ready with acknowledged writes not applied: {early[:3]}"
        not_ready_seen += sum(1 for s in observations if s["role"] == "leader" and not s["leader_ready"])
        print(f"round {round_}: {len(observations)} observations, leader not ready in {not_ready_seen} so far")
        if not_ready_seen:
            break
    assert not_ready_seen, "no round elected a leader before it applied the earlier terms' writes"
    leader = cluster.leader(timeout_s=60)
    wait_until(lambda: (s := leader.status()) is not None and s["leader_ready"], 30, "the leader ready")
    outcome = leader.request("submit", timeout_s=60, count=1, prefix="after", size=8)
    assert outcome["ok"] == 1, outcome
