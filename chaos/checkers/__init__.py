"""The history checker: :func:`check` turns a drill's history (operations, fault and status
observations, and the final read of every node) into a :class:`Report` of violations.

Checks: lost acknowledged writes, duplicates of idempotent publishes, inconsistent offsets (one
offset, two values; acks that disagree with the log; reads of values the log does not hold),
reordering within a partition, non-contiguous offsets, phantom writes, silent skips in reads,
replicas that disagree after healing or decided some command differently (apply digests), record
timestamps that go back within a partition, more than one leader per term, committed group
positions that regress, records never delivered to a group, a cluster command format that rises
before every member can apply it (or never rises after a rolling upgrade), and recovery after the
last fault heals; and liveness with stated bounds (publishes and a leader soon after the last heal,
expired leases delivered again, no group stalled).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.checkers.formats import check_formats
from chaos.checkers.groups import check_groups
from chaos.checkers.leaders import check_leaders, terms_seen
from chaos.checkers.liveness import check_liveness
from chaos.checkers.log import check_log, reference_reads
from chaos.checkers.model import Model, Violation, parse
from chaos.checkers.readers import check_readers, reader_counts
from chaos.checkers.recovery import measure
from chaos.checkers.replicas import apply_digests_skipped, check_apply_digests, check_replicas
from chaos.checkers.report import CHECKS, Report
from chaos.checkers.timestamps import check_timestamps
from chaos.history import Entry, pairs

__all__ = ["CHECKS", "Report", "Violation", "check"]


def check(entries: list[Entry], scenario: str = "", seed: int | None = None) -> Report:
    """Run every check over a history; the report's ``violations`` list is empty when all hold."""
    model = parse(entries)
    runs = [e.value for e in entries if e.type == "info" and e.f == "run" and isinstance(e.value, dict)]
    run: dict[str, Any] = runs[0] if runs else {}
    report = Report(scenario or str(run.get("scenario", "")), seed if seed is not None else run.get("seed"),
                    run=dict(run))
    recovery, recovery_violations = measure(model)
    report.recovery = recovery
    violations: list[Violation] = []
    violations += check_log(model)
    violations += check_readers(model)
    violations += check_replicas(model)
    violations += check_apply_digests(entries)
    violations += check_timestamps(model)
    violations += check_leaders(model)
    violations += check_groups(model)
    violations += check_formats(entries)
    violations += recovery_violations
    live, figures = check_liveness(model, recovery.last_heal_s, recovery.recovery_s)
    violations += live
    report.violations = violations
    report.operations = _operations(model, entries)
    report.operations["liveness"] = {"leader_after_heal_s": None if figures.leader_after_heal_s is None
                                     else round(figures.leader_after_heal_s, 3),
                                     "leases_judged": figures.leases_judged,
                                     "leases_not_judged": figures.leases_not_judged}
    report.checks_skipped = _skipped(model, entries)
    return report


def _operations(model: Model, entries: list[Entry]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    for _inv, done in model.publish_ops:
        counts["invoke"] += 1
        counts["info" if done is None else done.type] += 1
    refs = reference_reads(model)
    not_available = {str(e.value["workload"]): str(e.value["reason"]) for e in entries
                     if e.type == "info" and e.f == "workload-unavailable"}
    return {
        "publish": dict(counts),
        "records_published": len(model.records),
        "records_acked": sum(1 for f in model.records.values() if f.acked),
        "records_stored": sum(len(fr.records) for fr in refs.values()),
        "records_read": sum(reader_counts(model).values()),
        "group_deliveries": sum(1 for e in entries if e.type == "info" and e.f == "deliver"),
        "group_commits": sum(1 for _ in pairs(entries, "commit")),
        "group_commits_ok": sum(1 for e in entries if e.type == "ok" and e.f == "commit"),
        "group_committed_polls": sum(1 for e in entries if e.type == "info" and e.f == "committed"),
        "group_member_crashes": sum(1 for e in entries if e.type == "info" and e.f == "member-crash"),
        "groups_drained": sorted({str(e.value["group"]) for e in entries if e.type == "info"
                                  and e.f == "group-drained"}),
        "groups_not_drained": sorted({str(e.value["group"]) for e in entries if e.type == "info"
                                      and e.f == "group-not-drained"}),
        "leader_terms": terms_seen(model),
        "status_polls": sum(1 for e in entries if e.type == "info" and e.f == "status"),
        "not_available": not_available,
    }


def _skipped(model: Model, entries: list[Entry]) -> dict[str, str]:
    """Checks that had nothing to look at in this history, and why (never a silent pass)."""
    out: dict[str, str] = {}
    if not model.final_reads:
        for c in ("lost-write", "duplicate", "non-contiguous", "phantom-write", "replica-divergence",
                  "final-read-failed", "timestamp-regression"):
            out[c] = "no final read"
    elif all(fr.timestamps_ms is None for fr in model.final_reads):
        out["timestamp-regression"] = "the final reads carry no timestamps"
    if not any(e.f == "read" for e in entries):
        out["silent-skip"] = "no reader ran"
    if not any(e.f == "status" for e in entries):
        out["multiple-leaders"] = "no status polls"
    has_groups = any(e.f in ("deliver", "commit", "committed") for e in entries)
    if not has_groups:
        reason = next((str(e.value["reason"]) for e in entries if e.type == "info" and e.f == "workload-unavailable"
                       and e.value.get("workload") == "groups"), "no group workload ran")
        out["group-regress"] = out["undelivered"] = reason
    elif not any(e.type == "info" and e.f == "group-drained" for e in entries):
        out["undelivered"] = "no group drained"
    if not any(e.f == "fault" for e in entries):
        out["no-recovery"] = out["fault-not-healed"] = "no fault injected"
        out["slow-recovery"] = out["no-leader"] = "no fault injected"
    digests_skipped = apply_digests_skipped(entries)
    if digests_skipped is not None:
        out["apply-divergence"] = digests_skipped
    if not any(e.f == "formats" for e in entries):
        out["format-raised-early"] = out["format-not-raised"] = "no rolling upgrade"
    if not any(e.f == "group-config" and e.value.get("mode") == "queue" for e in entries):
        out["lease-not-redelivered"] = "no queue group (or a history without its configuration)"
    if not has_groups:
        out["group-stalled"] = out["group-regress"]
    return out
