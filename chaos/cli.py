"""``drill SCENARIO --seed N --duration S [--json]``: a chaos or failover drill against a local
cluster that the drill starts, with the checker's verdict (see docs/drills.md).

Registered on the broker's command line as ``raftbroker drill`` through the ``raftbroker.commands``
entry point (pyproject.toml; ``broker.cli.main`` loads it when chaos is installed, i.e. in a
checkout installed with ``pip install -e .``), and runnable as ``python -m chaos drill``.
Nothing of ``broker.cli`` is imported: the global ``--json`` of ``raftbroker`` is read from the
root context's ``obj`` (its ``json`` attribute), and ``drill --json`` works alone.

Prints the seed and the schedule first, each fault as it happens, then the checker's table; with
``--json``, progress goes to stderr and stdout gets the report (``{"violations": N, ...}``; for
``all``: ``{"violations": total, "scenarios": [report, ...]}``). Exit code 0 when no violation was
found (a scenario that is not available says so and does not fail), 1 on any violation, 3 when
the drill itself could not run, 2 on a bad argument (nothing started), 130/143 when interrupted by
SIGINT/SIGTERM (after the drill removed its nodes and network).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

EXIT_VIOLATIONS = 1
EXIT_DRILL_FAILED = 3
NETWORKS = ("auto", "netns", "proxy", "loopback")


def _global_json(ctx: typer.Context) -> bool:
    """The ``--json`` given before the command (``raftbroker --json drill ...``), if any."""
    return bool(getattr(ctx.find_root().obj, "json", False))


def _emit_json(obj: Any) -> None:
    """One compact JSON document on its own line of stdout."""
    sys.stdout.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n")
    sys.stdout.flush()


@contextmanager
def _interrupts() -> Iterator[list[int]]:
    """SIGTERM interrupts the drill as Ctrl-C does (KeyboardInterrupt in the main thread), so its
    teardown runs: without this a terminated drill left its nodes running (they are in sessions of
    their own) and its namespaces in place. The first signal interrupts; later ones are ignored
    until the teardown is over (a second Ctrl-C would break it). Yields the signals received."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    wanted = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.getsignal(s) for s in wanted}

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        for s in wanted:
            signal.signal(s, signal.SIG_IGN)
        raise KeyboardInterrupt

    for s in wanted:
        signal.signal(s, interrupt)
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _check_out(out: Path | None) -> None:
    """``--out`` must be a new or empty directory: a drill appending to an earlier run's history and
    starting its nodes on that run's data reported violations of its own making."""
    if out is not None and (out.is_file() or (out.is_dir() and any(out.iterdir()))):
        raise typer.BadParameter(f"{out} is not an empty directory (an earlier run's history and node data "
                                 "would mix with this run's); give a new or empty one", param_hint="'--out'")


def register(app: typer.Typer) -> None:
    """Add ``drill`` to ``app`` (the ``raftbroker.commands`` entry point, and ``python -m chaos``)."""
    app.command("drill")(drill_command)


def drill_command(
    ctx: typer.Context,
    scenario: Annotated[str, typer.Argument(help="kill-leader, kill-follower, pause-leader, partition-leader, "
                                            "partition-minority, packet-loss, power-loss, corrupt, membership, "
                                            "rolling-restart, rolling-upgrade, clock-jump, mixed, or all")],
    seed: Annotated[int, typer.Option(help="Seed of every random choice (printed; rerun with it to replay)")] = 1,
    duration: Annotated[float, typer.Option("--duration", min=5.0, max=3600.0,
                                            help="Seconds of faults per scenario")] = 30.0,
    nodes: Annotated[int, typer.Option(min=3, max=7, help="Nodes of the drill's cluster")] = 3,
    network: Annotated[str, typer.Option(help=f"{', '.join(NETWORKS)}: auto is namespaces if root, else proxies")]
    = "auto",
    out: Annotated[Path | None, typer.Option(help="Directory for history, report and node logs "
                                             "(default: a new temporary directory, kept)")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the JSON report (also accepted before the command)")]
    = False,
) -> None:
    """Run SCENARIO (or all) against a local cluster started for it; print the checker's table."""
    from chaos.drill import DrillError, DrillOptions, run_drill  # here: every `raftbroker` start loads this module
    from chaos.scenarios import ALL, SCENARIOS

    as_json = json_ or _global_json(ctx)
    if scenario != ALL and scenario not in SCENARIOS:
        raise typer.BadParameter(f"unknown scenario {scenario!r}; one of {', '.join([*SCENARIOS, ALL])}",
                                 param_hint="SCENARIO")
    if network not in NETWORKS:
        raise typer.BadParameter(f"unknown network {network!r}; one of {', '.join(NETWORKS)}", param_hint="'--network'")
    _check_out(out)

    def echo(line: str) -> None:
        print(line, file=sys.stderr if as_json else sys.stdout, flush=True)

    names = list(SCENARIOS) if scenario == ALL else [scenario]
    reports: list[dict[str, Any]] = []
    failed = False
    for name in names:
        run_out = None if out is None else (out / name if scenario == ALL else out)
        try:
            with _interrupts() as received:
                report = run_drill(DrillOptions(name, seed, duration, nodes, network, run_out), echo)
        except KeyboardInterrupt:
            signum = received[0] if received else signal.SIGINT
            echo(f"drill {name}: interrupted ({signal.Signals(signum).name}); its nodes and network were removed")
            raise typer.Exit(128 + signum) from None
        except Exception as err:  # DrillError, or anything that broke the drill itself: not a verdict
            if not isinstance(err, DrillError):
                err = DrillError(f"{type(err).__name__}: {err}")
            echo(f"drill {name}: could not run: {err}")
            reports.append({"scenario": name, "seed": seed, "available": True, "error": str(err), "violations": 0})
            failed = True
            continue
        echo(report.table())
        reports.append(report.to_json())
    total = sum(int(r["violations"]) for r in reports)
    if as_json:
        _emit_json(reports[0] if len(reports) == 1 else {"violations": total, "scenarios": reports})
    elif len(reports) > 1:
        echo("summary: " + "; ".join(f"{r['scenario']}: " + (
            "not available" if not r.get("available", True) else
            "could not run" if r.get("error") else f"{r['violations']} violation(s)") for r in reports))
    if total:
        raise typer.Exit(EXIT_VIOLATIONS)
    if failed:
        raise typer.Exit(EXIT_DRILL_FAILED)
