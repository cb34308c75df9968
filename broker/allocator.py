"""The node's memory allocator: jemalloc when the system has it (``raftbroker serve --allocator``).

Why. protobuf's Python runtime (upb) frees its arenas' blocks through an allocator that calls
glibc's ``malloc_trim(0)`` once every 10,000 frees (``upb_trim_allocfunc``; protobuf 7.36, and
still so in the newest release on PyPI). ``malloc_trim`` gives every free page of every malloc
arena back to the kernel (``madvise(MADV_DONTNEED)``), so the buffers a node allocates next, a
publish's request, command and messages, start on pages that fault when first written. A leader
of 1 KiB publishes frees that many blocks every second or two: it took 1.1-1.2 page faults per
record, each some microseconds in this VM, against 0.2-0.3 with the call made a no-op
(``strace -k`` shows the call stack: ``PyUpb_Arena_Dealloc`` -> ``upb_Arena_Free`` ->
``malloc_trim``). glibc's ``MALLOC_*_THRESHOLD_`` settings do not help: ``malloc_trim`` ignores them.
With jemalloc every ``malloc`` goes to jemalloc, and upb's ``malloc_trim`` reaches a glibc
allocator that holds next to nothing. bench/NOTE.md, 2026-11-28 (afternoon), has the figures.

How. The allocator is chosen when the dynamic linker loads the process, so ``serve`` re-executes
itself once with ``LD_PRELOAD`` naming the library, before it reads its configuration or starts a
thread: :func:`exec_early` at the top of the command line's entry point (``broker.cli.launch``),
before the CLI's imports (~0.8 s), so a start costs one interpreter start more, not a second CLI
import; ``serve`` itself checks again (``python -m broker.cli.main serve`` re-executes from there).
``execve`` keeps the process id, its open descriptors and its arguments, so a supervisor (or a
test) that started the node still holds the same process. ``RAFTBROKER_ALLOCATOR_EXEC`` marks
the second run, so a library that does not load cannot make the node re-execute for ever.

Modes (``--allocator`` or ``RAFTBROKER_ALLOCATOR``): ``auto`` (the default) uses jemalloc when
found and glibc's malloc otherwise; ``jemalloc`` refuses to start without it; ``system`` never
re-executes. A jemalloc given by the operator's own ``LD_PRELOAD`` is used as it is.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path

EXEC_MARK = "RAFTBROKER_ALLOCATOR_EXEC"
ENV = "RAFTBROKER_ALLOCATOR"
# where Debian, Ubuntu, Fedora and Alpine put it (package libjemalloc2 / jemalloc)
_SEARCH_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                "/usr/local/lib", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu")
_NAMES = ("libjemalloc.so.2", "libjemalloc.so.1", "libjemalloc.so")


class Allocator(StrEnum):
    AUTO = "auto"
    JEMALLOC = "jemalloc"
    SYSTEM = "system"


class AllocatorError(Exception):
    """``--allocator jemalloc`` where no jemalloc can be loaded."""


def find_jemalloc() -> Path | None:
    """A jemalloc shared library on this system (its path, or its soname when only ldconfig's cache
    knows where it is), or None."""
    for directory in _SEARCH_DIRS:
        for name in _NAMES:
            path = Path(directory) / name
            if path.is_file():
                return path
    soname = ctypes.util.find_library("jemalloc")  # ldconfig's cache knows other layouts
    return Path(soname) if soname else None  # a bare name: LD_PRELOAD searches like the linker does


def loaded_jemalloc(maps: str | None = None) -> str | None:
    """The jemalloc library mapped into this process (``/proc/self/maps``), or None."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return None
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset device inode [path]
        if len(fields) == 6 and Path(fields[5].strip()).name.startswith("libjemalloc"):
            return fields[5].strip()
    return None


def plan(mode: Allocator, env: Mapping[str, str], loaded: str | None,
         found: Path | None) -> tuple[dict[str, str] | None, str]:
    """(the environment to re-execute with, or None to go on in this process; what to log).

    Pure: the caller reads the process's state and does the ``execve``."""
    if mode is Allocator.SYSTEM:
        return None, "allocator: glibc malloc (--allocator system)"
    if loaded is not None:
        return None, f"allocator: jemalloc ({loaded})"
    if env.get(EXEC_MARK):
        message = f"allocator: jemalloc ({env.get('LD_PRELOAD', '')}) did not load; glibc malloc"
        if mode is Allocator.JEMALLOC:
            raise AllocatorError(message.replace("; glibc malloc", ""))
        return None, message
    if found is None:
        if mode is Allocator.JEMALLOC:
            raise AllocatorError("allocator: --allocator jemalloc, but no libjemalloc was found "
                                 "(Debian: apt-get install libjemalloc2)")
        return None, ("allocator: glibc malloc (no libjemalloc found; apt-get install libjemalloc2 cuts the "
                      "leader's CPU per 1 KiB record by about a tenth, docs/operations.md)")
    new_env = dict(env)
    preload = new_env.get("LD_PRELOAD", "").strip()
    new_env["LD_PRELOAD"] = f"{found} {preload}".strip()
    new_env[EXEC_MARK] = "1"
    return new_env, f"allocator: jemalloc ({found})"


def _execve(path: str, argv: list[str], env: dict[str, str]) -> None:
    os.execve(path, argv, env)


def choose(mode: Allocator, argv: Sequence[str] | None = None,
           execve: Callable[[str, list[str], dict[str, str]], object] = _execve) -> str:
    """Re-execute this process with jemalloc preloaded when ``mode`` asks for it and it is not loaded
    yet (does not return then); otherwise return the line to log. Call it before starting a thread."""
    new_env, message = plan(mode, os.environ, loaded_jemalloc(), find_jemalloc())
    if new_env is None:
        return message
    sys.stdout.flush()
    sys.stderr.flush()
    execve(sys.executable, list(sys.orig_argv if argv is None else argv), new_env)
    return message  # only with a test's execve


# the global options that take a value (broker/cli/main.py), so their value is not taken for the command
_GLOBAL_VALUE_OPTIONS = frozenset({"--bootstrap", "-b", "--timeout", "--retry-deadline", "--client-config"})


def command_of(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """(the command of a ``raftbroker`` command line, the arguments after it); (None, []) without one."""
    args = list(argv[1:])
    i = 0
    while i < len(args) and args[i].startswith("-"):  # global options before the command
        i += 2 if args[i] in _GLOBAL_VALUE_OPTIONS else 1
    if i >= len(args):
        return None, []
    return args[i], args[i + 1:]


def serve_mode(argv: Sequence[str], env: Mapping[str, str]) -> Allocator | None:
    """The ``--allocator`` of a ``raftbroker serve`` command line (flag, else ``RAFTBROKER_ALLOCATOR``,
    else auto); None for any other command or a value the CLI will refuse itself."""
    command, rest = command_of(argv)
    if command != "serve":
        return None
    value = env.get(ENV, Allocator.AUTO.value)
    for j, arg in enumerate(rest):
        if arg == "--allocator" and j + 1 < len(rest):
            value = rest[j + 1]
        elif arg.startswith("--allocator="):
            value = arg.partition("=")[2]
    try:
        return Allocator(value)
    except ValueError:
        return None


def exec_early(argv: Sequence[str] | None = None) -> None:
    """At an entry point's top: a ``serve`` command re-executes here with jemalloc when its mode asks
    for it. Anything else, a refusal included, is left to ``serve`` itself, which reports it."""
    mode = serve_mode(sys.argv if argv is None else argv, os.environ)
    if mode is None:
        return
    try:
        choose(mode)
    except AllocatorError:
        return


__all__ = ["ENV", "EXEC_MARK", "Allocator", "AllocatorError", "choose", "command_of", "exec_early", "find_jemalloc",
           "loaded_jemalloc", "plan", "serve_mode"]
