"""``python -m bench``: install what is missing, run every system and workload, write JSON, Markdown and PNG.

Examples::

    python -m bench                                  # the full run (make bench)
    python -m bench --smoke --out /tmp/bench          # tiny counts, raftbroker disk-3 and Redis
    python -m bench --systems raftbroker-disk-3,nats --reps 1
    python -m bench --render bench/results/2026-11-22.json   # re-render a document
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import shutil
import sys
from pathlib import Path

from bench import install, report
from bench.config import FULL, SMOKE, SYSTEMS, WORKLOADS, BenchConfig
from bench.procs import REGISTRY, install_cleanup

RESULTS = Path(__file__).resolve().parent / "results"


def _config(args: argparse.Namespace) -> BenchConfig:
    config = SMOKE if args.smoke else FULL
    changes: dict[str, object] = {}
    if args.systems:
        unknown = set(args.systems.split(",")) - set(SYSTEMS)
        if unknown:
            raise SystemExit(f"unknown system(s) {', '.join(sorted(unknown))}; choose from {', '.join(SYSTEMS)}")
        changes["systems"] = tuple(args.systems.split(","))
    if args.workloads:
        unknown = set(args.workloads.split(",")) - set(WORKLOADS)
        if unknown:
            raise SystemExit(f"unknown workload(s) {', '.join(sorted(unknown))}; choose from {', '.join(WORKLOADS)}")
        changes["workloads"] = tuple(args.workloads.split(","))
    if args.reps is not None:
        changes["reps"] = args.reps
    if args.records is not None:
        changes["publish_records"] = args.records
    if args.sizes:
        try:
            sizes = tuple(int(size) for size in args.sizes.split(","))
        except ValueError:
            raise SystemExit(f"--sizes takes comma-separated byte counts, not {args.sizes!r}") from None
        if any(size < 8 for size in sizes):
            raise SystemExit("--sizes: each record size is at least 8 bytes (the latency stamp)")
        changes["record_sizes"] = sizes
    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def write_outputs(doc: dict[str, object], out_dir: Path, stem: str, *, latest: bool) -> list[Path]:
    """``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` in ``out_dir`` (and copies named ``latest.*``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    paths[1].write_text(report.markdown(doc, chart=paths[2].name))
    report.chart(doc, paths[2])
    if latest:
        for path in paths:
            shutil.copyfile(path, out_dir / f"latest{path.suffix}")
        (out_dir / "latest.md").write_text(report.markdown(doc, chart="latest.png"))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny counts, raftbroker disk-3 and Redis only")
    parser.add_argument("--systems", help=f"comma-separated subset of {','.join(SYSTEMS)}")
    parser.add_argument("--workloads", help=f"comma-separated subset of {','.join(WORKLOADS)}")
    parser.add_argument("--reps", type=int, help="repetitions per workload (default 3)")
    parser.add_argument("--records", type=int, help="records per publish run (default 1000000)")
    parser.add_argument("--sizes", help="comma-separated record sizes in bytes of publish runs (default 100,1024)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="output directory (default bench/results)")
    parser.add_argument("--render", type=Path, help="only re-render this results JSON")
    parser.add_argument("--latest", action="store_true", help="with --render: also write latest.* beside it")
    parser.add_argument("--no-install", action="store_true", help="fail instead of installing what is missing")
    args = parser.parse_args(argv)
    if args.render:
        doc = json.loads(args.render.read_text())
        for path in write_outputs(doc, args.render.parent, args.render.stem, latest=args.latest):
            print(path)
        return 0
    config = _config(args)
    if args.no_install:
        missing = install.missing_packages(config.systems) + install.missing_modules()
        if missing:
            print(f"missing: {', '.join(missing)}", file=sys.stderr)
            return 2
    else:
        install.ensure_python_clients()
        install.ensure_peers(config.systems)
    install_cleanup()
    from bench.runner import run_all  # after the clients are installed

    try:
        doc = run_all(config, args.out)
    finally:
        REGISTRY.stop_all()
    stem = dt.date.today().isoformat() if not args.smoke else "smoke"
    for path in write_outputs(doc, args.out, stem, latest=not args.smoke and args.out == RESULTS):
        print(path)
    failed = [s["name"] for s in doc["systems"] if s["status"] == "error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
