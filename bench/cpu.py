"""CPU seconds spent by a deployment's server processes and by the benchmark client, read from /proc.

Every server the benchmark starts runs in its own session (its PID is its process group id, see
:mod:`bench.procs`), so a server's CPU is the sum of ``utime + stime`` over every live process of that
process group (all threads included; children such as RabbitMQ's ``beam.smp`` or a node's CEL worker
count too). The client is this process (``RUSAGE_SELF``: every thread of it). A workload takes one
:class:`CpuSample` before and one after the measured window; the difference is what the window cost.
A process that exits inside the window loses its CPU from the sum, so no workload that kills nodes
reports CPU.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid_dir: Path) -> list[str] | None:
    try:
        text = (pid_dir / "stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid pgrp ...: comm may contain spaces and parentheses, so split after the last ')'.
    return text[text.rindex(")") + 2:].split()


def group_cpu_s(pgids: Iterable[int]) -> float:
    """User + system CPU seconds of every live process whose process group is in ``pgids``."""
    wanted = set(pgids)
    total_ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry)
        # After the comm: [0] state, [1] ppid, [2] pgrp, ..., [11] utime, [12] stime (proc(5) fields 14, 15).
        if fields is None or len(fields) < 13 or int(fields[2]) not in wanted:
            continue
        total_ticks += int(fields[11]) + int(fields[12])
    return total_ticks / _TICKS_PER_S


def client_cpu_s() -> float:
    """User + system CPU seconds of this process so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds at one instant: the deployment's servers and the client."""

    servers_s: float
    client_s: float

    @classmethod
    def take(cls, pgids: Iterable[int]) -> CpuSample:
        return cls(group_cpu_s(pgids), client_cpu_s())

    def since(self, earlier: CpuSample) -> CpuSample:
        return CpuSample(self.servers_s - earlier.servers_s, self.client_s - earlier.client_s)
