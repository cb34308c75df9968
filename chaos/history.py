"""The history of a drill: one JSON object per line, appended by many threads.

Each entry is ``{"index", "type", "process", "f", "value", "time", "wall"}``:
``type`` is ``invoke`` (an operation starts), ``ok`` (it took effect), ``fail`` (it definitely did
not) or ``info`` (unknown outcome, or an observation such as a fault, a status poll or a read);
``process`` names the worker; ``f`` the operation (``publish``, ``read``, ``fault``, ``heal``,
``status``, ``deliver``, ``commit``, ``committed``, ``final-read``, ...); ``time`` is seconds since
the start of the run (monotonic clock), ``wall`` the epoch time. A process runs one operation at a
time, so the completion of an invoke is the next ok/fail/info entry of the same process and ``f``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

TYPES = ("invoke", "ok", "fail", "info")


@dataclass(frozen=True)
class Entry:
    """One line of a history."""

    index: int
    type: str
    process: str
    f: str
    value: Any
    time: float
    wall: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "type": self.type, "process": self.process, "f": self.f,
                "value": self.value, "time": round(self.time, 6), "wall": round(self.wall, 6)}

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Entry:
        if obj.get("type") not in TYPES:
            raise ValueError(f"history entry {obj.get('index')}: bad type {obj.get('type')!r}")
        return Entry(int(obj["index"]), obj["type"], str(obj["process"]), str(obj["f"]), obj.get("value"),
                     float(obj["time"]), float(obj.get("wall", 0.0)))


@dataclass
class History:
    """A thread-safe, append-only history; written to ``path`` line by line when one is given."""

    path: Path | None = None
    entries: list[Entry] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _start: float = field(default_factory=time.monotonic, repr=False)
    _out: IO[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.path is not None:
            self._out = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed in close())

    def now(self) -> float:
        """Seconds since the history started (the ``time`` of an entry appended now)."""
        return time.monotonic() - self._start

    def append(self, type_: str, process: str, f: str, value: Any = None) -> Entry:
        """Record one entry now and return it."""
        assert type_ in TYPES, type_
        with self._lock:
            entry = Entry(len(self.entries), type_, process, f, value, self.now(), time.time())
            self.entries.append(entry)
            if self._out is not None:
                self._out.write(json.dumps(entry.to_json(), separators=(",", ":")) + "\n")
        return entry

    def invoke(self, process: str, f: str, value: Any = None) -> Entry:
        return self.append("invoke", process, f, value)

    def ok(self, process: str, f: str, value: Any = None) -> Entry:
        return self.append("ok", process, f, value)

    def fail(self, process: str, f: str, value: Any = None) -> Entry:
        return self.append("fail", process, f, value)

    def info(self, process: str, f: str, value: Any = None) -> Entry:
        return self.append("info", process, f, value)

    def close(self) -> None:
        with self._lock:
            if self._out is not None:
                self._out.close()
                self._out = None


def load(path: Path) -> list[Entry]:
    """Every entry of a JSONL history file, in file order (a torn last line is ignored)."""
    entries: list[Entry] = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            entries.append(Entry.from_json(json.loads(line)))
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break  # the writer died mid-line
            raise
    return entries


def dump(entries: Iterable[Entry], path: Path) -> None:
    """Write entries as JSONL (tests build histories by hand with this)."""
    with open(path, "w", encoding="utf-8") as f:
        for e in entries:
            f.write(json.dumps(e.to_json(), separators=(",", ":")) + "\n")


def pairs(entries: Iterable[Entry], f: str) -> Iterator[tuple[Entry, Entry | None]]:
    """(invoke, completion) of every ``f`` operation; completion is ``None`` if the run ended first."""
    open_: dict[str, Entry] = {}
    for e in entries:
        if e.f != f:
            continue
        if e.type == "invoke":
            if e.process in open_:
                yield open_.pop(e.process), None
            open_[e.process] = e
        elif e.process in open_:
            yield open_.pop(e.process), e
    for inv in open_.values():
        yield inv, None
