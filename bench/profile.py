"""Sampling profile of a running raftbroker node with py-spy, summarized as the top functions.

py-spy attaches to the PID without pausing it (``--nonblocking``) and writes folded stacks
("frame;frame;frame count" per line). Self time is the leaf frame of each stack; inclusive time is
every distinct frame on it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class HotSpot:
    """One function's share of the samples."""

    function: str
    self_pct: float
    total_pct: float


def start_profiler(pid: int, duration_s: float, output: Path, *, gil_only: bool = False) -> subprocess.Popen[bytes]:
    """Start ``py-spy record`` on ``pid`` for ``duration_s`` seconds, writing folded stacks to ``output``.

    ``gil_only``: sample only the thread holding the GIL (what the interpreter is busy with; the
    default view also counts threads that are runnable but waiting for the GIL or in C code)."""
    exe = shutil.which("py-spy") or str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "py-spy")
    argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(duration_s))), "--rate", "200",
            "--format", "raw", "--nonblocking", "--output", str(output), *(["--gil"] if gil_only else [])]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _short(frame: str) -> str:
    """``func (path/to/module.py:123)`` → ``func (module.py)``."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match.group("file")
    parts = path.replace("\\", "/").split("/")
    if "site-packages" in parts:
        where = f"{parts[parts.index('site-packages') + 1]}/…/{parts[-1]}"
    else:
        where = "/".join(parts[-2:])
    return f"{match.group('func')} ({where})"


def hot_spots(folded: str, top: int = 15) -> tuple[int, list[HotSpot]]:
    """Total samples and the ``top`` functions by self time (with their inclusive time)."""
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = 0
    for line in folded.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        samples += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            total_counts[frame] += count
    if samples == 0:
        return 0, []
    spots = [HotSpot(name, 100.0 * n / samples, 100.0 * total_counts[name] / samples)
             for name, n in self_counts.most_common(top)]
    return samples, spots


def top_inclusive(folded: str, top: int = 15) -> list[HotSpot]:
    """The ``top`` functions by inclusive time (where the time goes, including callees)."""
    samples, _ = hot_spots(folded, 0)
    total_counts: Counter[str] = Counter()
    self_counts: Counter[str] = Counter()
    for line in folded.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";") if f.strip()]
        if frames:
            self_counts[frames[-1]] += int(count_text)
        for frame in set(frames):
            total_counts[frame] += int(count_text)
    if samples == 0:
        return []
    return [HotSpot(name, 100.0 * self_counts[name] / samples, 100.0 * n / samples)
            for name, n in total_counts.most_common(top)]
