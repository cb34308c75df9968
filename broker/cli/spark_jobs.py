"""``raftbroker pipeline run|show`` and ``raftbroker archive``: the Spark jobs (SPEC §7).

``pipeline run module:attr``: ``attr`` of ``module`` (importable, or a ``.py`` path) is a
:class:`broker.pipeline.Pipeline`, a stage or a list of stages; one progress line per micro-batch
(records in/out, lag), ``--json`` prints them as JSON objects. ``pipeline show`` prints the
Mermaid text. ``archive TOPIC --to DIR`` writes the topic to Parquet and prunes what it wrote.
Every job takes ``--master`` (any Spark master URL; default ``local[*]``).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from broker.cli.context import BootstrapOption, JsonFlag, reported_errors, state

if TYPE_CHECKING:  # pydantic and the SDK, imported when a command runs
    from broker.pipeline import Pipeline

app = typer.Typer(help="Run pipelines (source.pipe(fn).to(target) DAGs) on Spark, or draw them.",
                  no_args_is_help=True)
MasterOption = Annotated[str, typer.Option("--master", help="Spark master URL (local[*], spark://host:7077, ...).")]


def load_target(reference: str) -> tuple[Pipeline, Path | None]:
    """``module:attr`` (``module`` dotted, or a path to a .py file) as a pipeline, and the
    module's file (shipped to executors)."""
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise typer.BadParameter(f"expected module:attr, got {reference!r}", param_hint="TARGET")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
        else:
            sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as err:
        raise typer.BadParameter(f"cannot import {module_name!r}: {err}", param_hint="TARGET") from None
    if not hasattr(module, attr):
        raise typer.BadParameter(f"module {module_name!r} has no attribute {attr!r}", param_hint="TARGET")
    from broker.pipeline import as_pipeline

    try:
        pipeline = as_pipeline(getattr(module, attr))
    except (TypeError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint="TARGET") from None
    file = getattr(module, "__file__", None)
    return pipeline, Path(file) if file else None


@app.command("show")
def show(target: Annotated[str, typer.Argument(help="module:attr naming a Pipeline or stages.")]) -> None:
    """Print the pipeline's DAG as Mermaid text."""
    pipeline, _ = load_target(target)
    typer.echo(pipeline.mermaid(), nl=False)


@app.command("run")
def run(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="module:attr naming a Pipeline or stages.")],
    master: MasterOption = "local[*]",
    checkpoint: Annotated[Path | None, typer.Option("--checkpoint", help="Root of the stages' checkpoints.")] = None,
    until: Annotated[str, typer.Option("--until", help="caught_up (stop when done) or forever.")] = "caught_up",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print what would be written; write nothing.")] = False,
    max_records: Annotated[int | None, typer.Option("--max-records-per-batch", min=1)] = None,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Run every stage as a Spark Structured Streaming query against the cluster."""
    if until not in ("caught_up", "forever"):
        raise typer.BadParameter("use caught_up or forever", param_hint="--until")
    pipeline, file = load_target(target)
    opts = state(ctx)

    def progress(item: Any) -> None:
        typer.echo(json.dumps(item.__dict__) if opts.json else item.line())

    with reported_errors():
        from broker.spark import session

        spark = session(master, app_name=f"raftbroker-pipeline-{pipeline.name}")
        if file is not None and file.suffix == ".py":
            spark.sparkContext.addPyFile(str(file))  # executors import the stage functions from it
        reports = pipeline.run(bootstrap=",".join(opts.bootstrap), until=until, spark=spark, checkpoint=checkpoint,
                               dry_run=dry_run, on_progress=progress, max_records_per_batch=max_records)
        for name, report in reports.items():
            summary = {"stage": name, "records_in": report.records_in, "records_out": report.records_out,
                       "batches": report.batches, "dry_run": dry_run}
            typer.echo(json.dumps(summary) if opts.json else
                       f"{name}: {report.records_in} in, {report.records_out} out"
                       f"{' (dry run: nothing written)' if dry_run else f' in {report.batches} batch(es)'}")


def archive(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="The topic to archive.")],
    to: Annotated[Path, typer.Option("--to", help="Directory of the Parquet archive (partitioned by date).")],
    master: MasterOption = "local[*]",
    group: Annotated[str, typer.Option("--group", help="The lead consumer group that holds the progress.")
                     ] = "archive",
    prune: Annotated[bool, typer.Option("--prune/--no-prune", help="Prune what was archived.")] = True,
    json_: JsonFlag = False,
    bootstrap_: BootstrapOption = None,
) -> None:
    """Write TOPIC's new records to Parquet under DIR, commit the progress (group marked lead),
    and prune what was durably written (never past a protect group)."""
    opts = state(ctx)
    with reported_errors():
        from broker.spark import session
        from broker.spark.archive import run_archive

        spark = session(master, app_name=f"raftbroker-archive-{topic}")
        result = run_archive(spark, ",".join(opts.bootstrap), topic, to, group=group, prune=prune)
        if opts.json:
            typer.echo(json.dumps(result.as_dict()))
        else:
            typer.echo(result.summary())


def register(root: typer.Typer) -> None:
    """Add ``pipeline`` and ``archive`` to the root app."""
    root.add_typer(app, name="pipeline")
    root.command("archive")(archive)
