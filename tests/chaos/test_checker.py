"""The checker finds each anomaly in a hand-made history and passes a clean one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.checkers import check
from chaos.checkers.formats import check_formats
from chaos.history import History, dump, load
from tests.chaos.builders import TOPIC, Hist, clean

pytestmark = pytest.mark.unit


def kinds(h: Hist) -> list[str]:
    return sorted({v.kind for v in check(h.entries).violations})


def test_a_clean_history_passes_every_check() -> None:
    report = check(clean().entries, scenario="hand", seed=1)
    assert report.violations == [], report.table()
    doc = report.to_json()
    assert doc["violations"] == 0
    assert doc["operations"]["records_acked"] == 6
    assert doc["recovery"]["recovery_s"] is not None
    assert "not available" not in report.table()


def test_a_lost_acknowledged_write_is_found_and_named() -> None:
    h = clean()
    h.finals(0, [(0, "a0"), (1, "a1"), (2, "a2")])  # a3 acknowledged at 0:3, gone everywhere
    report = check(h.entries)
    lost = [v for v in report.violations if v.kind == "lost-write"]
    assert lost and lost[0].records == ("a3",)


def test_a_duplicate_of_an_idempotent_publish_is_found() -> None:
    h = clean()
    h.finals(0, [(0, "a0"), (1, "a1"), (2, "a2"), (3, "a3"), (4, "a2")])
    report = check(h.entries)
    dup = [v for v in report.violations if v.kind == "duplicate"]
    assert dup and dup[0].records == ("a2@0:2,0:4",)


def test_one_offset_acknowledged_for_two_records_is_inconsistent() -> None:
    h = Hist()
    h.publish("p0", [("x", 0)], [(0, 0)])
    h.publish("p1", [("y", 0)], [(0, 0)])
    h.finals(0, [(0, "x"), (1, "y")])
    assert "inconsistent-offset" in kinds(h)


def test_an_ack_naming_another_offset_than_the_log_is_inconsistent() -> None:
    h = Hist()
    h.publish("p0", [("x", 0)], [(0, 5)])
    h.finals(0, [(0, "x")])
    assert kinds(h) == ["inconsistent-offset"]


def test_a_read_of_a_value_the_log_does_not_hold_is_inconsistent() -> None:
    h = clean()
    h.read("r1", 1, [(0, "b0"), (1, "b1")])  # b1 failed and is not stored: a dirty read
    assert kinds(h) == ["inconsistent-offset"]


def test_reordering_within_a_partition_is_found() -> None:
    h = Hist()
    h.publish("p0", [("x", 0)], [(0, 1)])
    h.publish("p0", [("y", 0)], [(0, 0)])  # sent after x was acked, stored before it
    h.finals(0, [(0, "y"), (1, "x")])
    report = check(h.entries)
    assert [v.kind for v in report.violations] == ["reorder"]
    assert "y@0 after x@1" in report.violations[0].records[0]


def test_a_batch_stored_out_of_its_order_is_reordering() -> None:
    h = Hist()
    h.publish("p0", [("x", 0), ("y", 0)], [(0, 1), (0, 0)])
    h.finals(0, [(0, "y"), (1, "x")])
    assert kinds(h) == ["reorder"]


def test_concurrent_publishes_may_land_in_either_order() -> None:
    h = Hist()
    h.add("invoke", "p0", "publish", {"topic": TOPIC, "records": [["x", 0]]})
    h.add("invoke", "p1", "publish", {"topic": TOPIC, "records": [["y", 0]]})
    h.add("ok", "p0", "publish", {"results": [[0, 1, False]]})
    h.add("ok", "p1", "publish", {"results": [[0, 0, False]]})
    h.finals(0, [(0, "y"), (1, "x")])
    assert kinds(h) == []


def test_non_contiguous_offsets_are_found() -> None:
    h = Hist()
    h.publish("p0", [("x", 0), ("y", 0)], [(0, 0), (0, 2)])
    h.finals(0, [(0, "x"), (2, "y")])
    assert kinds(h) == ["non-contiguous"]


def test_a_stored_record_that_was_never_published_or_definitely_failed_is_a_phantom() -> None:
    h = Hist()
    h.publish("p0", [("x", 0)], None, outcome="fail")
    h.finals(0, [(0, "x"), (1, "ghost")])
    report = check(h.entries)
    assert {r for v in report.violations if v.kind == "phantom-write" for r in v.records} == {"x", "ghost"}


def test_replicas_that_disagree_after_healing_are_found_with_the_offsets() -> None:
    h = clean()
    h.final("n3", 1, [(0, "b0")])  # n3 misses 1:1
    report = check(h.entries)
    div = [v for v in report.violations if v.kind == "replica-divergence"]
    assert div and div[0].records == ("1:1 n1=b2 n3=-",)


def test_a_node_serving_a_corrupted_record_diverges_and_an_unreadable_node_fails() -> None:
    h = clean()
    h.final("n2", 1, [(0, "b0")], events=[{"event": "badmsg", "offset_before": 1, "offset_after": 2}])
    h.final("n3", 0, [], error="UNAVAILABLE: connection refused")
    assert kinds(h) == ["final-read-failed", "replica-divergence"]


def test_a_timestamp_lower_than_its_predecessor_is_found_and_named() -> None:
    h = clean()
    h.finals(0, [(0, "a0"), (1, "a1"), (2, "a2"), (3, "a3")], timestamps_ms=[1000, 1500, 1200, 1300])
    report = check(h.entries)
    assert [v.kind for v in report.violations] == ["timestamp-regression"]
    assert report.violations[0].records == ("0:2=a2 ts=1200 < 0:1=a1 ts=1500 (-300 ms) on n1,n2,n3",)
    assert report.to_json()["checks"]["timestamp-regression"] == 1
    assert "timestamp-regression   1 VIOLATION(S)" in report.table()


def test_a_regression_on_one_replica_only_names_that_node() -> None:
    h = clean()
    h.final("n3", 1, [(0, "b0"), (1, "b2")], timestamps_ms=[1400, 1000])
    report = check(h.entries)
    regress = [v for v in report.violations if v.kind == "timestamp-regression"]
    assert regress and regress[0].records == ("1:1=b2 ts=1000 < 1:0=b0 ts=1400 (-400 ms) on n3",)


def test_equal_timestamps_are_not_a_regression_and_old_histories_skip_the_check() -> None:
    h = clean()
    h.finals(1, [(0, "b0"), (1, "b2")], timestamps_ms=[1400, 1400])  # a leader clock that went back
    assert kinds(h) == []
    old = Hist()
    old.publish("p0", [("x", 0)], [(0, 0)])
    old.finals(0, [(0, "x")])  # written before final reads carried timestamps
    doc = check(old.entries).to_json()
    assert doc["violations"] == 0
    assert doc["checks"]["timestamp-regression"] == "skipped: the final reads carry no timestamps"


def test_two_leaders_in_one_term_are_found() -> None:
    h = clean()
    h.status("n3", "leader", 2)  # n2 led term 2 already
    report = check(h.entries)
    assert [v.kind for v in report.violations] == ["multiple-leaders"]
    assert report.violations[0].records == ("term 2: n2", "term 2: n3")


def test_a_reader_that_skips_offsets_without_an_event_is_found() -> None:
    h = clean()
    h.read("r1", 0, [(0, "a0"), (2, "a2")])
    assert kinds(h) == ["silent-skip"]


def test_a_skip_announced_by_an_event_is_not_silent() -> None:
    h = clean()
    h.read("r1", 0, [(0, "a0")])
    h.add("info", "r1", "read-event", {"topic": TOPIC, "partition": 0, "event": "skip_forward",
                                       "offset_before": 1, "offset_after": 2})
    h.read("r1", 0, [(2, "a2")])
    assert kinds(h) == []


def test_a_committed_group_position_that_regresses_is_found() -> None:
    h = clean()
    g = {"topic": TOPIC, "group": "g", "partition": 0}
    h.add("invoke", "c0", "commit", {**g, "offset": 3})
    h.add("ok", "c0", "commit", {**g, "offset": 3})
    h.add("info", "c0", "committed", {**g, "offset": 1})  # after a failover the group went back
    report = check(h.entries)
    assert [v.kind for v in report.violations] == ["group-regress"]
    assert report.violations[0].records == ("t/g/0: 1 after 3",)


def test_a_commit_that_failed_does_not_count_as_committed() -> None:
    h = clean()
    g = {"topic": TOPIC, "group": "g", "partition": 0}
    h.add("invoke", "c0", "commit", {**g, "offset": 3})
    h.add("info", "c0", "commit", {**g, "offset": 3})
    h.add("info", "c0", "committed", {**g, "offset": 1})
    assert kinds(h) == []


def test_a_record_never_delivered_to_a_drained_group_is_found() -> None:
    h = clean()
    for p, o, rid in [(0, 0, "a0"), (0, 1, "a1"), (0, 3, "a3"), (1, 0, "b0"), (1, 1, "b2")]:
        h.add("info", "c0", "deliver", {"topic": TOPIC, "group": "g", "member": "c0", "partition": p,
                                        "offset": o, "id": rid})
    h.add("info", "c0", "group-drained", {"topic": TOPIC, "group": "g"})
    report = check(h.entries)
    assert [v.kind for v in report.violations] == ["undelivered"]
    assert report.violations[0].records == ("0:2=a2",)


def test_no_acknowledgement_after_the_last_heal_means_no_recovery() -> None:
    h = Hist()
    h.publish("p0", [("x", 0)], [(0, 0)])
    h.fault(1)
    h.heal(1)
    h.publish("p0", [("y", 0)], None, outcome="info")
    h.finals(0, [(0, "x")])
    assert kinds(h) == ["no-recovery"]


def test_a_fault_never_healed_is_a_violation() -> None:
    h = clean()
    h.fault(2, "partition")
    assert "fault-not-healed" in kinds(h)


def test_recovery_times_are_measured_from_the_heal() -> None:
    h = Hist()
    h.fault(1)
    h.heal(1)  # t = 0.2
    h.publish("p0", [("x", 0)], [(0, 0)])  # invoked 0.3, acked 0.4
    h.finals(0, [(0, "x")])
    rec = check(h.entries).recovery
    assert rec.recovery_s == pytest.approx(0.2)
    assert rec.faults[0]["first_ack_after_fault_s"] == pytest.approx(0.3)


def test_convergence_is_reported_from_when_the_writes_stopped_not_from_the_heal() -> None:
    h = clean()
    h.fault(1)
    h.heal(1)
    # the drill runs the workload 2 s past the first ack after the heal, then waits for convergence
    h.add("info", "drill", "converged", {"applied_index": 9, "after_heal_s": 2.15, "after_writes_stopped_s": 0.05})
    report = check(h.entries)
    assert report.recovery.converged_s == pytest.approx(2.15)
    assert report.recovery.converged_after_stop_s == pytest.approx(0.05)
    assert "converged 0.05s after the writes stopped" in report.table()
    assert report.to_json()["recovery"]["converged_after_stop_s"] == pytest.approx(0.05)


def test_checks_without_data_say_so_instead_of_passing() -> None:
    h = Hist()
    h.publish("p0", [("x", 0)], [(0, 0)])
    doc = check(h.entries).to_json()
    assert doc["checks"]["lost-write"] == "skipped: no final read"
    assert doc["checks"]["timestamp-regression"] == "skipped: no final read"
    assert doc["checks"]["group-regress"].startswith("skipped")


def test_a_history_round_trips_through_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    hist = History(path)
    hist.invoke("p0", "publish", {"topic": TOPIC, "records": [["x", 0]]})
    hist.ok("p0", "publish", {"results": [[0, 0, False]]})
    hist.close()
    with open(path, "a") as f:
        f.write('{"index": 2, "type": "ok", "proc')  # a writer killed mid-line
    entries = load(path)
    assert [e.type for e in entries] == ["invoke", "ok"]
    dump(entries, tmp_path / "copy.jsonl")
    assert [json.loads(line)["f"] for line in (tmp_path / "copy.jsonl").read_text().splitlines()] == ["publish"] * 2


def test_a_record_delivered_again_long_after_its_previous_delivery_is_late() -> None:
    h = clean()
    deliver = {"topic": TOPIC, "group": "g", "member": "c0", "partition": 0, "offset": 0, "id": "a0"}
    h.add("info", "c0", "deliver", deliver)
    h.add("info", "c0", "deliver", deliver, dt=5.0)  # lease ran out: in time
    assert kinds(h) == []
    h.add("info", "c1", "deliver", {**deliver, "member": "c1"}, dt=600.0)  # waited for a clock jump
    report = check(h.entries)
    assert [v.kind for v in report.violations] == ["redelivery-late"]
    assert "delivered again after 600.0 s" in report.violations[0].records[0]


def formats_seen(h: Hist, moment: str, nodes: dict[str, tuple[int, int]]) -> None:
    """The rolling-upgrade nemesis's record: node -> (apply format, cluster format)."""
    h.add("info", "nemesis", "formats", {"moment": moment, "code_format": 1,
                                         "nodes": {n: {"apply": a, "cluster": c} for n, (a, c) in nodes.items()}})


def test_a_rolling_upgrade_whose_format_rises_after_the_last_member_passes() -> None:
    h = Hist()
    formats_seen(h, "before upgrading n1", {"n1": (0, 0), "n2": (0, 0), "n3": (0, 0)})
    formats_seen(h, "before upgrading n3", {"n1": (1, 0), "n2": (1, 0), "n3": (0, 0)})
    formats_seen(h, "after the last upgrade", {"n1": (1, 1), "n2": (1, 1), "n3": (1, 0)})
    formats_seen(h, "after the last upgrade", {"n1": (1, 1), "n2": (1, 1), "n3": (1, 1)})
    assert check_formats(h.entries) == []
    assert "format-raised-early" in check(Hist().entries).checks_skipped


def test_a_format_raised_while_a_member_runs_the_older_release_is_found() -> None:
    h = Hist()
    formats_seen(h, "before upgrading n3", {"n1": (1, 1), "n2": (1, 0), "n3": (0, 0)})
    found = check_formats(h.entries)
    assert [v.kind for v in found] == ["format-raised-early"]
    assert "n3" in found[0].detail and found[0].records == ("n1: cluster format 1",)


def test_a_format_that_never_rises_after_the_upgrade_or_a_silent_node_is_found() -> None:
    h = Hist()
    formats_seen(h, "before upgrading n3", {"n1": (1, 0), "n2": (1, 0), "n3": (0, 0)})
    formats_seen(h, "after the last upgrade", {"n1": (1, 1), "n2": (1, 0)})
    found = check_formats(h.entries)
    assert [v.kind for v in found] == ["format-not-raised"]
    assert found[0].records == ("n2: cluster format 0", "n3: did not answer")


def digests_seen(h: Hist, digests: dict[str, str], differing: list[str], errors: dict[str, str] | None = None) -> None:
    h.add("info", "checker", "apply-digests", {"index": 42, "agreed": not differing and not errors,
                                               "differing": differing, "digests": digests, "errors": errors or {}})


def test_apply_digests_that_agree_pass_and_a_differing_node_is_named() -> None:
    h = clean()
    digests_seen(h, {"n1": "0000abcd", "n2": "0000abcd", "n3": "0000abcd"}, [])
    report = check(h.entries)
    assert report.violations == [] and "apply-divergence" not in report.checks_skipped
    h = clean()
    digests_seen(h, {"n1": "0000abcd", "n2": "0000abcd", "n3": "0000ffff"}, ["n3"])
    found = [v for v in check(h.entries).violations if v.kind == "apply-divergence"]
    assert len(found) == 1 and "n3 decided some command differently" in found[0].detail
    assert found[0].records == ("n1=0000abcd", "n2=0000abcd", "n3=0000ffff")


def test_apply_digests_not_compared_are_reported_as_skipped_with_the_reason() -> None:
    assert check(clean().entries).checks_skipped["apply-divergence"] == "no verification"
    h = clean()
    digests_seen(h, {}, [], {n: "they begin when the cluster's command format reaches 2" for n in ("n1", "n2")})
    assert "fewer than two nodes gave a digest (they begin" in check(h.entries).checks_skipped["apply-divergence"]
    h = clean()
    h.add("info", "checker", "apply-digests", {"error": "UNAVAILABLE: no node answered"})
    skipped = check(h.entries).checks_skipped["apply-divergence"]
    assert skipped == "the verification failed: UNAVAILABLE: no node answered"
