"""The ``raftbroker`` program's entry point (``python -m broker.cli.launch`` too): a ``serve`` command
picks its memory allocator first, re-executing itself with jemalloc before the CLI's imports
(:func:`broker.allocator.exec_early`), then the CLI runs as ``broker.cli.main`` defines it.

gRPC's C core logs through its own logger to stderr, at INFO when ``GRPC_VERBOSITY`` is unset. Before
grpc is imported, :func:`grpc_verbosity` sets what the command wants unless the caller set it:
- a node (``serve``) logs ERROR and above: at INFO, every connection a plaintext caller opens to a TLS
  port wrote a "Handshake failed" line to the node's log, a log any caller could flood;
- every other command logs none: it reports each failure itself in one line (``raftbroker: error:``),
  and C core's lines ("Failed to add port", "Handshake failed") came before it, as noise.
A command that starts nodes (``dev``, drills) passes its environment on; the nodes' own launch then
puts ERROR back, since :data:`QUIET_MARK` says the NONE was ours, not the caller's.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping, Sequence

from broker.allocator import command_of, exec_early

VERBOSITY_ENV = "GRPC_VERBOSITY"
QUIET_MARK = "RAFTBROKER_GRPC_QUIETED"  # set beside GRPC_VERBOSITY=NONE when this entry point chose it


def grpc_verbosity(argv: Sequence[str], env: MutableMapping[str, str]) -> None:
    """Set ``GRPC_VERBOSITY`` in ``env`` for the command of ``argv`` (see the module docstring); a value
    the caller set is kept."""
    ours = env.get(QUIET_MARK) == "1"
    if VERBOSITY_ENV in env and not ours:
        return
    if command_of(argv)[0] == "serve":
        env[VERBOSITY_ENV] = "ERROR"
        env.pop(QUIET_MARK, None)
    else:
        env[VERBOSITY_ENV] = "NONE"
        env[QUIET_MARK] = "1"


def main() -> None:
    import sys

    exec_early()
    grpc_verbosity(sys.argv, os.environ)
    from broker.cli.main import app

    app(prog_name="raftbroker")


if __name__ == "__main__":
    main()
