"""Summaries of repetitions (median, min, max) and raftbroker/peer ratios; pure functions."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Summary:
    """The median of ``n`` repetitions with their min and max."""

    median: float
    min: float
    max: float
    n: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Summary:
        return cls(float(data["median"]), float(data["min"]), float(data["max"]), int(data["n"]))


def summarize(values: Sequence[float]) -> Summary:
    """Median, min and max of at least one value."""
    assert values, "nothing to summarize"
    return Summary(statistics.median(values), min(values), max(values), len(values))


def summarize_reps(reps: Sequence[Mapping[str, float]]) -> dict[str, Summary]:
    """One :class:`Summary` per metric present in any repetition."""
    names = sorted({name for rep in reps for name in rep})
    return {name: summarize([rep[name] for rep in reps if name in rep]) for name in names}


def ratio(ours: float | None, theirs: float | None) -> float | None:
    """``ours / theirs``, or ``None`` when either is missing or the divisor is zero."""
    if ours is None or theirs is None or theirs == 0:
        return None
    return ours / theirs
