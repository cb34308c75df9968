"""The ``raftbroker`` program's entry point (``python -m broker.cli.launch`` too): a ``serve`` command
picks its memory allocator first, re-executing itself with jemalloc before the CLI's imports
(:func:`broker.allocator.exec_early`), then the CLI runs as ``broker.cli.main`` defines it."""

from __future__ import annotations

from broker.allocator import exec_early


def main() -> None:
    exec_early()
    from broker.cli.main import app

    app(prog_name="raftbroker")


if __name__ == "__main__":
    main()
