"""The liveness checks fail a cluster that stops making progress, within their stated bounds, and
leave alone what a fault explains."""

from __future__ import annotations

import pytest

from chaos.checkers import check
from chaos.checkers.liveness import FAULT_SETTLE_S, LEADER_BOUND_S, LEASE_BOUND_S, RECOVERY_BOUND_S
from tests.chaos.builders import TOPIC, Hist, clean

pytestmark = pytest.mark.unit
GROUP = "q"
VIS_S = 2.5


def kinds(h: Hist) -> list[str]:
    return sorted({v.kind for v in check(h.entries).violations})


def queue_group(h: Hist) -> None:
    """The group's configuration, recorded once the faults of ``clean()`` have settled."""
    h.t += FAULT_SETTLE_S
    h.add("info", "groups", "group-config", {"topic": TOPIC, "group": GROUP, "mode": "queue",
                                             "visibility_timeout_ms": int(VIS_S * 1000)})


def deliver(h: Hist, member: str, offset: int, dt: float = 0.1) -> None:
    h.add("info", f"proc-{member}", "deliver", {"topic": TOPIC, "group": GROUP, "member": member, "partition": 0,
                                                "offset": offset, "id": f"x{offset}", "attempt": 1}, dt)


def ack(h: Hist, member: str, offset: int, dt: float = 0.1) -> None:
    h.add("invoke", f"proc-{member}", "ack", {"topic": TOPIC, "group": GROUP, "member": member,
                                              "records": [[0, offset]]}, dt)
    h.add("ok", f"proc-{member}", "ack", {"count": 1})


def test_a_clean_history_with_a_queue_group_passes_and_judges_its_leases() -> None:
    h = clean()
    queue_group(h)
    deliver(h, "m1", 0)
    ack(h, "m1", 0)
    deliver(h, "m1", 1)  # never acked: its lease expires ...
    deliver(h, "m2", 1, dt=VIS_S + 1)  # ... and it comes back in time
    ack(h, "m2", 1)
    deliver(h, "m2", 2, dt=LEASE_BOUND_S + VIS_S + 1)  # the run goes on past the deadline
    report = check(h.entries)
    assert report.violations == [], report.table()
    assert report.to_json()["operations"]["liveness"]["leases_judged"] == 1
    assert "lease-not-redelivered" not in report.checks_skipped


def test_an_expired_lease_never_delivered_again_is_a_violation() -> None:
    h = clean()
    queue_group(h)
    deliver(h, "m1", 1)
    deliver(h, "m2", 2, dt=LEASE_BOUND_S + VIS_S + 1)
    report = check(h.entries)
    found = [v for v in report.violations if v.kind == "lease-not-redelivered"]
    assert found and "0:1 leased to m1" in found[0].records[0], report.table()


def test_a_late_redelivery_is_a_violation_and_a_nack_does_not_settle() -> None:
    h = clean()
    queue_group(h)
    deliver(h, "m1", 1)
    h.add("invoke", "proc-m1", "nack", {"topic": TOPIC, "group": GROUP, "member": "m1", "records": [[0, 1]]})
    deliver(h, "m2", 1, dt=VIS_S + LEASE_BOUND_S + 1)
    deliver(h, "m2", 9, dt=LEASE_BOUND_S + VIS_S + 1)
    assert kinds(h) == ["lease-not-redelivered"]


def test_a_fault_extends_the_wait_for_a_redelivery_by_its_length() -> None:
    h = clean()
    queue_group(h)
    deliver(h, "m1", 1)
    h.fault(7)
    h.heal(7, dt=2.0)
    h.publish("p0", [("a3", 0)], [(0, 3)])  # acknowledged after the heal (a retry of a stored record)
    deliver(h, "m2", 1, dt=VIS_S + LEASE_BOUND_S)  # late but for the fault, in time with it
    ack(h, "m2", 1)
    deliver(h, "m2", 2, dt=FAULT_SETTLE_S + LEASE_BOUND_S + VIS_S + 1)
    report = check(h.entries)
    assert report.violations == [], report.table()
    assert report.to_json()["operations"]["liveness"]["leases_judged"] >= 1


def lease_across_a_slow_recovery(recovery_s: float, redelivered_after_s: float) -> Hist:
    """A lease taken just before a fault; after the heal the first publish is acknowledged
    ``recovery_s`` later (a stored record's retry, so the history stays clean), and the record is
    delivered again ``redelivered_after_s`` after that."""
    h = clean()
    queue_group(h)
    deliver(h, "m1", 1)
    h.fault(7)
    h.heal(7, dt=1.5)
    h.add("invoke", "p0", "publish", {"topic": TOPIC, "records": [["a3", 0]]})
    h.add("ok", "p0", "publish", {"results": [[0, 3, False]]}, dt=recovery_s)
    deliver(h, "m2", 1, dt=redelivered_after_s)
    ack(h, "m2", 1)
    deliver(h, "m2", 2, dt=LEASE_BOUND_S + VIS_S + 1)
    return h


def test_a_fault_lasts_until_the_cluster_serves_again_not_only_its_settle_time() -> None:
    """The power-loss drill on a loaded machine: every node restarted, the first ack came 12 s after
    the heal; leases taken just before the fault came back right after that, which is in time."""
    h = lease_across_a_slow_recovery(FAULT_SETTLE_S + 7, VIS_S + LEASE_BOUND_S - 1)
    report = check(h.entries)
    assert report.violations == [], report.table()
    assert report.to_json()["operations"]["liveness"]["leases_judged"] >= 1
    # the same recovery does not excuse a redelivery later still
    assert kinds(lease_across_a_slow_recovery(FAULT_SETTLE_S + 7, VIS_S + LEASE_BOUND_S + 1)) == [
        "lease-not-redelivered"]


def test_a_slow_recovery_after_the_last_heal_is_a_violation() -> None:
    h = Hist()
    h.publish("p0", [("a0", 0)], [(0, 0)])
    h.fault(1)
    h.heal(1)
    h.add("invoke", "p0", "publish", {"topic": TOPIC, "records": [["a1", 0]]})
    h.add("ok", "p0", "publish", {"results": [[0, 1, False]]}, dt=RECOVERY_BOUND_S + 1)
    h.finals(0, [(0, "a0"), (1, "a1")])
    assert kinds(h) == ["slow-recovery"]


def test_no_leader_soon_after_the_last_heal_is_a_violation() -> None:
    assert kinds(clean()) == []  # a leader known when the fault healed
    for late_s, found in ((1.0, []), (LEADER_BOUND_S + 1, ["no-leader"])):
        h = Hist()
        h.status("n1", "leader", 1)
        h.status("n2", "follower", 1)
        h.publish("p0", [("a0", 0)], [(0, 0)])
        h.fault(1)
        h.status("n1", "candidate", 2)  # the leader lost its term; nobody leads yet
        h.heal(1)
        h.publish("p0", [("a1", 0)], [(0, 1)])
        h.t += late_s
        h.status("n2", "leader", 3)
        h.finals(0, [(0, "a0"), (1, "a1")])
        assert kinds(h) == found, late_s


def test_a_group_that_did_not_drain_is_stalled() -> None:
    h = clean()
    h.add("info", "groups", "group-not-drained", {"topic": TOPIC, "group": GROUP, "ends": {"0": 4},
                                                  "committed": {"0": 2}, "lag": 2})
    assert kinds(h) == ["group-stalled"]


def test_a_late_ack_by_the_holder_settles_a_lease_that_was_not_redelivered_yet() -> None:
    h = clean()
    queue_group(h)
    deliver(h, "m1", 1)
    ack(h, "m1", 1, dt=VIS_S + 1)  # after its lease, before anybody else got it: settled
    deliver(h, "m2", 2, dt=LEASE_BOUND_S + VIS_S + 1)
    report = check(h.entries)
    assert report.violations == [], report.table()
    too_late = clean()
    queue_group(too_late)
    deliver(too_late, "m1", 1)
    ack(too_late, "m1", 1, dt=VIS_S + LEASE_BOUND_S + 1)  # nothing happened to it for too long
    deliver(too_late, "m2", 2, dt=LEASE_BOUND_S + VIS_S + 1)
    assert kinds(too_late) == ["lease-not-redelivered"]


def test_a_duplicate_delivery_of_a_settled_record_needs_no_redelivery() -> None:
    h = clean()
    queue_group(h)
    deliver(h, "m1", 1)
    ack(h, "m1", 1)
    deliver(h, "m1", 1)  # at-least-once: delivered again after it was settled (e.g. around a failover)
    deliver(h, "m2", 2, dt=LEASE_BOUND_S + VIS_S + 1)
    ack(h, "m2", 2)
    report = check(h.entries)
    assert report.violations == [], report.table()
