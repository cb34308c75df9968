"""The checker's verdict: a JSON report (top-level ``violations`` count) and a short table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos.checkers.model import Violation
from chaos.checkers.recovery import Recovery

CHECKS = ("lost-write", "duplicate", "inconsistent-offset", "reorder", "non-contiguous", "phantom-write",
          "silent-skip", "replica-divergence", "apply-divergence", "final-read-failed", "timestamp-regression",
          "multiple-leaders", "group-regress",
          "undelivered", "redelivery-late", "no-recovery", "fault-not-healed", "slow-recovery", "no-leader",
          "lease-not-redelivered", "group-stalled", "format-raised-early", "format-not-raised")


@dataclass
class Report:
    """Everything a drill found. ``available=False`` means the scenario did not run (``reason``)."""

    scenario: str
    seed: int | None
    available: bool = True
    reason: str = ""
    run: dict[str, Any] = field(default_factory=dict)
    operations: dict[str, Any] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    recovery: Recovery = field(default_factory=Recovery)
    checks_skipped: dict[str, str] = field(default_factory=dict)  # check -> why it had nothing to check
    artifacts: dict[str, str] = field(default_factory=dict)

    @property
    def violation_count(self) -> int:
        return len(self.violations)

    def to_json(self) -> dict[str, Any]:
        kinds = Counter(v.kind for v in self.violations)
        return {
            "scenario": self.scenario, "seed": self.seed, "available": self.available, "reason": self.reason,
            "violations": self.violation_count,
            "checks": {c: ("skipped: " + self.checks_skipped[c]) if c in self.checks_skipped else kinds.get(c, 0)
                       for c in CHECKS},
            "anomalies": [v.to_json() for v in self.violations],
            "operations": self.operations, "recovery": self.recovery.to_json(), "run": self.run,
            "artifacts": self.artifacts,
        }

    def table(self) -> str:
        """A short human summary: the run, each check's count, each fault, the recovery times."""
        head = f"drill {self.scenario} seed={self.seed}"
        if not self.available:
            return f"{head}: not available: {self.reason}"
        lines = [f"{head}  network={self.run.get('network', '?')}  duration={self.run.get('duration_s', '?')}s"]
        ops = self.operations
        pub = ops.get("publish", {})
        lines.append(f"  operations: publish invoke={pub.get('invoke', 0)} ok={pub.get('ok', 0)} "
                     f"fail={pub.get('fail', 0)} info={pub.get('info', 0)}  records acked={ops.get('records_acked', 0)}"
                     f" stored={ops.get('records_stored', 0)}  read by readers={ops.get('records_read', 0)}")
        if ops.get("group_deliveries") or ops.get("group_commits"):
            lines.append(f"  groups: deliveries={ops.get('group_deliveries', 0)} commits={ops.get('group_commits', 0)}"
                         f" (ok={ops.get('group_commits_ok', 0)}) committed polls={ops.get('group_committed_polls', 0)}"
                         f" member crashes={ops.get('group_member_crashes', 0)}"
                         f"  drained: {', '.join(ops.get('groups_drained', [])) or '-'}"
                         + (f"  NOT drained: {', '.join(ops['groups_not_drained'])}" if ops.get("groups_not_drained")
                            else ""))
        for name, why in ops.get("not_available", {}).items():
            lines.append(f"  workload {name}: not available: {why}")
        lines.append(f"  {'check':<22} result")
        kinds = Counter(v.kind for v in self.violations)
        for c in CHECKS:
            res = f"skipped ({self.checks_skipped[c]})" if c in self.checks_skipped else (
                "ok" if not kinds.get(c) else f"{kinds[c]} VIOLATION(S)")
            lines.append(f"  {c:<22} {res}")
        rec = self.recovery
        for f in rec.faults:
            targets = ",".join(map(str, f.get("targets", [])))
            lines.append(f"  fault {f['id']}: {f['kind']} {targets} at {f['at_s']:.1f}s"
                         f" healed {_s(f['healed_s'])}  first ack after {_s(f.get('first_ack_after_fault_s'))}"
                         + (f"  ({f['detail']})" if f.get("detail") else ""))
        converged = f"converged {_s(rec.converged_s)}" if rec.converged_after_stop_s is None else \
            f"converged {_s(rec.converged_after_stop_s)} after the writes stopped"
        lines.append(f"  recovery after last heal: first ack {_s(rec.recovery_s)}, {converged};"
                     f" longest stretch without acks {_s(rec.max_unavailable_s)}")
        live = ops.get("liveness")
        if live:
            lines.append(f"  liveness: leader {_s(live.get('leader_after_heal_s'))} after the last heal; "
                         f"expired leases judged {live.get('leases_judged', 0)} (not judged, near a fault or the end: "
                         f"{live.get('leases_not_judged', 0)})")
        for v in self.violations:
            lines.append(f"  VIOLATION {v.kind}: {v.detail}")
            for r in v.records[:5]:
                lines.append(f"      {r}")
            if v.count > 5:
                lines.append(f"      ... {v.count - 5} more")
        lines.append(f"  violations: {self.violation_count}")
        return "\n".join(lines)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"
