"""What gRPC health says about a node (SPEC §5): SERVING only when its Raft runs, a leader is
known (and, on the leader, a quorum follows it), it is not catching up, and (a follower) it is not
taking back the `memory` records it lost at its start.

*A leader is known* on a follower means: it names a leader and a message from a current leader
reached it within :data:`LEADER_SILENCE_S_MAX` (with PreVote, a follower cut off from the rest
never starts an election, so it would name its old leader forever).

*Catching up* means: this node's applied index is more than :data:`CATCH_UP_ENTRIES_MAX` entries
behind the commit index the leader last announced to it, or it has heard no commit index from a
leader yet (a node that just started, or one installing a snapshot: pysyncobj applies nothing
until the snapshot is in, so its applied index stays behind the leader's commit index meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from broker.replication import ReplicaStatus, Role

CATCH_UP_ENTRIES_MAX = 1000
LEADER_SILENCE_S_MAX = 3.0  # several election timeouts (0.4-0.8 s) and heartbeat periods (0.05 s)


class Observed(Protocol):
    """The parts of a replicator health looks at (``PysyncobjReplicator``)."""

    @property
    def failure(self) -> BaseException | None: ...

    def status(self) -> ReplicaStatus: ...

    def leader_contact(self) -> tuple[int | None, float]: ...


def replica_health(replicator: Observed, refilling: Callable[[], bool] = lambda: False) -> tuple[bool, str]:
    """(serving, why not) for the node whose replicator this is. ``refilling()``: a follower is
    taking back from the others the `memory` records it lost at its start (``services/memory_refill.py``):
    not ready until it is done, so that a rolling restart (the StatefulSet waits for each pod to be
    ready) does not restart the nodes it reads them from. A leader stays ready (it takes writes)."""
    failure = replicator.failure
    if failure is not None:
        return False, f"Raft halted: {failure}"
    status = replicator.status()
    if status.leader_address is None:
        return False, f"no leader known (this node is a {status.role.value}, term {status.term})"
    if status.role == Role.LEADER:
        if not status.has_quorum:
            return False, "leader without a quorum of followers"
        return True, ""
    leader_commit, silence_s = replicator.leader_contact()
    if silence_s > LEADER_SILENCE_S_MAX:
        return False, f"no leader: nothing heard from a leader for {silence_s:.1f} s (limit {LEADER_SILENCE_S_MAX} s)"
    if leader_commit is None:
        return False, "catching up: no commit index heard from the leader yet"
    behind = leader_commit - status.applied_index
    if behind > CATCH_UP_ENTRIES_MAX:
        return False, (f"catching up: applied index {status.applied_index} is {behind} entries behind the "
                       f"leader's commit index {leader_commit} (limit {CATCH_UP_ENTRIES_MAX})")
    if refilling():
        return False, "taking back from the other nodes the memory-topic records this node lost at its start"
    return True, ""
