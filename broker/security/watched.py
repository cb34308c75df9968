"""A file parsed again whenever its modification time or size changes (rotation without restart)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class WatchedFile(Generic[T]):
    """``parse(text)`` of the file at ``path``, re-parsed when the file changes (checked on every
    :meth:`get`: one ``stat``). The first load raises ``ValueError``/``OSError`` (a node must not
    start on a broken file); a later broken version is logged and the last good one kept, so a
    half-written update never locks everyone out."""

    def __init__(self, path: Path, parse: Callable[[str], T]) -> None:
        self.path = Path(path)
        self._parse = parse
        self._lock = threading.Lock()
        self._stamp = self._stat()
        try:
            self._value = parse(self.path.read_text())
        except ValueError as exc:  # a TOML error says where in the file, not which file
            raise ValueError(f"invalid {self.path}: {exc}") from None
        self._unreadable = False  # logged once until the file can be stat'ed again (not on every call)

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return st.st_mtime_ns, st.st_size, st.st_ino

    def get(self) -> T:
        try:
            stamp = self._stat()
        except OSError as exc:
            if not self._unreadable:
                self._unreadable = True
                log.error("cannot read %s (%s); keeping the last good version", self.path, exc)
            return self._value
        self._unreadable = False
        if stamp == self._stamp:
            return self._value
        with self._lock:
            if stamp != self._stamp:
                try:
                    self._value = self._parse(self.path.read_text())
                    log.info("reloaded %s", self.path)
                except (OSError, ValueError) as exc:
                    log.error("invalid %s (%s); keeping the last good version", self.path, exc)
                self._stamp = stamp
            return self._value
