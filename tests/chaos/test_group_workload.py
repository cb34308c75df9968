"""The consumer-group workload records what the group checks read: its ledger in-process (what is
recorded, what is left out, and that the checker then finds a real regression and no false one),
and one short real drill whose groups deliver, commit, are polled and drain."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.client import PartitionLag
from chaos.checkers import check
from chaos.drill import DrillOptions, run_drill
from chaos.history import History
from chaos.workloads.group_ledger import GroupLedger
from chaos.workloads.groups import GROUP_MODES, group_config

TOPIC = "t"


def ledger(partitions: int = 1) -> GroupLedger:
    return GroupLedger(History(), TOPIC, "g", partitions)


def row(partition: int, committed: int, end: int = 10) -> PartitionLag:
    return PartitionLag(partition, 0, end, committed, end - committed, 0, 0, 0, 0)


def committed_offsets(led: GroupLedger) -> list[int]:
    return [e.value["offset"] for e in led.history.entries if e.f == "committed" and e.type == "info"]


@pytest.mark.unit
def test_the_delivered_prefix_advances_only_over_offsets_delivered() -> None:
    led = ledger()
    for o in (0, 2, 3):
        led.delivered("m", "m.1", 0, o, f"r{o}", 1)
    assert led.delivered_prefix(0) == 1
    led.delivered("m", "m.2", 0, 1, "r1", 2)
    led.delivered("m", "m.2", 0, 1, "r1", 3)  # a redelivery changes nothing
    assert led.delivered_prefix(0) == 4
    delivers = [e.value for e in led.history.entries if e.f == "deliver"]
    assert len(delivers) == 5 and delivers[0] == {"topic": TOPIC, "group": "g", "partition": 0, "member": "m.1",
                                                  "offset": 0, "id": "r0", "attempt": 1}


@pytest.mark.unit
def test_a_commit_at_or_below_a_position_already_observed_is_not_invoked() -> None:
    led = ledger()
    led.polled("lag", [row(0, 5)], led.poll_token())
    assert not led.begin_commit("m", 0, 5)
    assert led.begin_commit("m", 0, 6)
    led.end_commit("m", 0, 6, None)
    assert not led.begin_commit("m", 0, 6)
    commits = [(e.type, e.value["offset"]) for e in led.history.entries if e.f == "commit"]
    assert commits == [("invoke", 6), ("ok", 6)]
    assert check(led.history.entries).violations == []


@pytest.mark.unit
def test_a_poll_below_a_commit_acknowledged_while_it_was_in_flight_is_left_out() -> None:
    led = ledger()
    token = led.poll_token()  # the poll is sent ...
    assert led.begin_commit("m", 0, 7)
    led.end_commit("m", 0, 7, None)  # ... a commit is acknowledged ...
    led.polled("lag", [row(0, 4)], token)  # ... the leader had answered before it applied
    assert committed_offsets(led) == [] and led.ambiguous_polls == 1
    led.polled("lag", [row(0, 7)], token)  # as high as known: recorded whatever the token
    assert committed_offsets(led) == [7]
    assert check(led.history.entries).violations == []


@pytest.mark.unit
def test_a_committed_position_that_went_back_is_recorded_and_found() -> None:
    led = ledger(2)
    assert led.begin_commit("m", 1, 7)
    led.end_commit("m", 1, 7, None)
    led.polled("lag", [row(0, 3), row(1, 4)], led.poll_token())  # partition 1 went back after the commit
    assert committed_offsets(led) == [3, 4]
    report = check(led.history.entries)
    assert [v.kind for v in report.violations] == ["group-regress"]
    assert report.violations[0].records == ("t/g/1: 4 after 7",)


@pytest.mark.unit
def test_a_commit_of_unknown_outcome_proves_nothing() -> None:
    led = ledger()
    assert led.begin_commit("m", 0, 7)
    led.end_commit("m", 0, 7, TimeoutError("deadline"))
    led.polled("lag", [row(0, 2)], led.poll_token())
    assert [e.type for e in led.history.entries if e.f == "commit"] == ["invoke", "info"]
    assert committed_offsets(led) == [2] and check(led.history.entries).violations == []


@pytest.mark.unit
def test_a_group_that_did_not_drain_skips_the_undelivered_check_and_says_so() -> None:
    led = ledger()
    led.delivered("m", "m.1", 0, 0, "r0", 1)
    led.history.info("groups", "group-not-drained", {"topic": TOPIC, "group": "g"})
    report = check(led.history.entries)
    doc = report.to_json()
    assert doc["checks"]["undelivered"] == "skipped: no group drained"
    assert doc["operations"]["groups_not_drained"] == ["g"] and doc["operations"]["group_deliveries"] == 1
    assert "groups: deliveries=1 commits=0 (ok=0)" in report.table() and "NOT drained: g" in report.table()


@pytest.mark.unit
@pytest.mark.parametrize("mode", sorted(set(GROUP_MODES.values())))
def test_each_group_config_is_one_the_sdk_accepts_for_its_mode(mode: str) -> None:
    from broker.client.groups import group_config as wire_config

    wire_config(mode, **group_config(mode))  # a queue-mode group with a session timeout is refused
    assert ("session_timeout_ms" in group_config(mode)) == (mode == "stream")


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_short_drill_records_deliveries_commits_polls_and_drains_both_groups(tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_drill(DrillOptions("kill-leader", 1, 10.0, out_dir=tmp_path / "drill", readers=False), lines.append)
    print("\n".join(lines))
    print(report.table())
    doc = report.to_json()
    ops = doc["operations"]
    assert doc["violations"] == 0, report.table()
    assert ops["not_available"] == {}
    assert ops["group_deliveries"] >= 2 * ops["records_stored"] > 0, "each group got every record"
    assert ops["group_commits_ok"] > 0 and ops["group_committed_polls"] > 0
    assert ops["groups_drained"] == sorted(GROUP_MODES) and ops["groups_not_drained"] == []
    assert doc["checks"]["group-regress"] == 0 and doc["checks"]["undelivered"] == 0
