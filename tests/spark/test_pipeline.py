"""Pipelines on a real cluster: a two-stage DAG with fan-out and fan-in run until caught up (and
again, resuming), the CLI's run/show/--dry-run, the pipeline example of docs/spark.md run as
written, and the archive job (prune only what it wrote, a protect group respected, a crashed run
re-run writes nothing twice)."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pyspark.sql import SparkSession

from broker.client import Client
from broker.pipeline import Pipeline, topic
from broker.pipeline.runner import Progress
from broker.spark.archive import run_archive
from tests.spark.conftest import records_only, spark_env

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "spark.md"


def make_topics(bootstrap: str, prefix: str) -> None:
    from tests.spark.pipelines_example import Big, Order
    with Client(bootstrap) as client:
        client.topic(f"{prefix}-orders", Order, partitions=2)
        client.topic(f"{prefix}-big", Big, partitions=2)
        for name in ("audit", "alerts", "manual"):
            client.create_topic(f"{prefix}-{name}", 2)


def publish_orders(bootstrap: str, prefix: str, first: int, count: int) -> None:
    with Client(bootstrap) as client:
        client.publish_batch(f"{prefix}-orders", [
            {"value": json.dumps({"id": i, "amount": 50 + (i % 4) * 40, "items": [f"x{j}" for j in range(i % 3)]}),
             "key": f"c{i % 5}"} for i in range(first, first + count)])


def values(bootstrap: str, name: str) -> list[str]:
    with Client(bootstrap) as client:
        return [r.value.decode() for r in records_only(client.subscribe(name, stop_at_end=True))]


def expected_big(ids: range) -> list[int]:
    return [i for i in ids if 50 + (i % 4) * 40 > 100]


def test_two_stage_dag_with_fan_out_and_fan_in(spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    from tests.spark.pipelines_example import pipeline
    make_topics(bootstrap, "p")
    publish_orders(bootstrap, "p", 0, 40)
    with Client(bootstrap) as client:
        client.publish("p-manual", b"by hand")
    progress: list[Progress] = []
    reports = pipeline.run(bootstrap=bootstrap, spark=spark, checkpoint=tmp_path, until="caught_up",
                           on_progress=progress.append, max_records_per_batch=30)
    big = sorted(json.loads(v)["id"] for v in values(bootstrap, "p-big"))
    assert big == expected_big(range(40))
    assert sorted(values(bootstrap, "p-audit")) == sorted(f"{i}:x{j}" for i in range(40) for j in range(i % 3))
    alerts = values(bootstrap, "p-alerts")
    wanted = [f'alert {{"id":{i},"amount":{50 + (i % 4) * 40}}}' for i in expected_big(range(40))]
    assert sorted(alerts) == sorted([*wanted, "alert by hand"])
    assert progress and all(p.records_in <= 30 for p in progress)
    assert reports["p-orders--big_orders--p-big"].records_in == 40
    assert progress[-1].lag == 0
    publish_orders(bootstrap, "p", 40, 8)  # a second run reads only what is new
    pipeline.run(bootstrap=bootstrap, spark=spark, checkpoint=tmp_path)
    assert sorted(json.loads(v)["id"] for v in values(bootstrap, "p-big")) == expected_big(range(48))
    assert len(values(bootstrap, "p-alerts")) == len(expected_big(range(48))) + 1


def test_pipeline_mermaid_and_cycle() -> None:
    from tests.spark.pipelines_example import pipeline
    text = pipeline.mermaid()
    assert text.startswith("flowchart LR\n") and '-->|"big_orders"|' in text and text.count("-->") == 4
    a, b = topic("a"), topic("b")
    with pytest.raises(ValueError, match="cycle"):
        Pipeline([a.pipe(str).to(b), b.pipe(str).to(a)])


def cli(bootstrap: str, *args: str, prefix: str = "c") -> subprocess.CompletedProcess[str]:
    env = spark_env(PIPELINE_TOPIC_PREFIX=prefix)
    return subprocess.run([sys.executable, "-m", "broker.cli.main", "--bootstrap", bootstrap, *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=500)


def test_cli_pipeline_show_dry_run_and_run(bootstrap: str, tmp_path: Path) -> None:
    make_topics(bootstrap, "c")
    publish_orders(bootstrap, "c", 0, 12)
    shown = cli(bootstrap, "pipeline", "show", "tests.spark.pipelines_example:pipeline")
    assert shown.returncode == 0 and shown.stdout.startswith("flowchart LR") and "c-orders" in shown.stdout
    dry = cli(bootstrap, "pipeline", "run", "tests.spark.pipelines_example:pipeline", "--master", "local[2]",
              "--checkpoint", str(tmp_path), "--dry-run")
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "[dry run] c-orders--big_orders--c-big: 12 records in, 6 would be written to c-big" in dry.stdout
    assert values(bootstrap, "c-big") == [] and not any(tmp_path.iterdir())
    ran = cli(bootstrap, "pipeline", "run", "tests.spark.pipelines_example:pipeline", "--master", "local[2]",
              "--checkpoint", str(tmp_path), "--until", "caught_up")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "c-orders--big_orders--c-big batch 0: 12 in, 6 out, lag 0" in ran.stdout
    assert len(values(bootstrap, "c-alerts")) == 6


def documented(section: str) -> list[tuple[str, str]]:
    """The code blocks of ``section`` of docs/spark.md as written: (info string, text) pairs."""
    lines = DOCS.read_text().split("\n## " + section + "\n", 1)[1].split("\n## ", 1)[0].splitlines()
    blocks: list[tuple[str, str]] = []
    opened: tuple[str, list[str]] | None = None
    for line in lines:
        if line.startswith("```") and opened is None:
            opened = (line[3:].strip(), [])
        elif line.startswith("```") and opened is not None:
            blocks.append((opened[0], "\n".join(opened[1]) + "\n"))
            opened = None
        elif opened is not None:
            opened[1].append(line)
    return blocks


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"doc_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic looks its models' module up
    spec.loader.exec_module(module)
    return module


def test_the_documented_pipeline_example_runs_as_written(bootstrap: str, tmp_path: Path) -> None:
    """docs/spark.md's ``shop_pipeline.py`` and its ``raftbroker pipeline show/run`` commands, taken
    from the doc as they are: the run ends with every stage's outputs written (a typed source's
    function gets the model: the doc once used ``r.value`` on one, and the run exited 1)."""
    source = tmp_path / "shop_pipeline.py"
    blocks = documented("Pipelines")
    source.write_text(next(text for info, text in blocks if info == "python"))
    shop = load_module(source)
    with Client(bootstrap) as client:
        client.topic("orders", shop.Order, partitions=2)
        client.topic("big", shop.Big, partitions=2)
        for name in ("audit", "alerts"):
            client.create_topic(name, 2)
        client.publish_batch("orders", [shop.Order(id=i, amount=50 + 20 * i).model_dump_json() for i in range(10)])
    commands = [shlex.split(line.partition("#")[0]) for info, text in blocks if not info for line in text.splitlines()]
    show = next(c for c in commands if c[1:3] == ["pipeline", "show"])
    run = next(c for c in commands if c[1:3] == ["pipeline", "run"] and "--until" in c)
    run[run.index("--checkpoint") + 1] = str(tmp_path / "checkpoints")
    env = spark_env()
    raftbroker = str(Path(sys.executable).with_name("raftbroker"))
    for command in (show, [*run, "--master", "local[2]"]):
        done = subprocess.run([raftbroker, "--bootstrap", bootstrap, *command[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=500)
        assert done.returncode == 0, f"{shlex.join(command)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    assert "big" in done.stdout and "alerts" in done.stdout
    big = [i for i in range(10) if 50 + 20 * i > 100]
    assert sorted(json.loads(v)["id"] for v in values(bootstrap, "big")) == big
    assert sorted(values(bootstrap, "audit")) == sorted(str(i) for i in range(10) for _ in range(2))
    assert sorted(values(bootstrap, "alerts")) == sorted(f'alert {{"id":{i}}}' for i in big)


def test_archive_prunes_only_what_it_wrote_and_respects_protect(spark: SparkSession, bootstrap: str,
                                                                 tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    with Client(bootstrap) as client:
        client.create_topic("arch", 2)
        client.publish_batch("arch", [{"value": f"r{i}", "partition": i % 2} for i in range(40)])
        client.groups.create("arch", "reporting", mode="stream", start="earliest")
        client.groups.mark("arch", "reporting", "protect")
        client.groups.seek("arch", "reporting", 5, partition=0)
        client.groups.seek("arch", "reporting", 20, partition=1)
    first = run_archive(spark, bootstrap, "arch", archive)
    assert first.records_written == 40 and first.blocked_by == ["reporting"]
    with Client(bootstrap) as client:
        assert client.end_offsets("arch") == {0: (5, 20), 1: (20, 20)}  # held at the protect group's position
        client.publish_batch("arch", [{"value": f"r{i}", "partition": i % 2} for i in range(40, 50)])
        client.groups.seek("arch", "reporting", "latest")
    # a crash after writing and before committing: the group is moved back; the archive knows better
    with Client(bootstrap) as client:
        client.groups.seek("arch", "archive", 10, partition=0)
    second = run_archive(spark, bootstrap, "arch", archive)
    assert second.records_written == 10 and second.ranges == {0: (20, 25), 1: (20, 25)}
    rows = spark.read.parquet(str(archive)).collect()
    assert sorted((r.partition, r.offset) for r in rows) == sorted((i % 2, i // 2) for i in range(50))
    assert {r.value.decode() for r in rows} == {f"r{i}" for i in range(50)}
    assert all(str(r.date) == str(r.timestamp.date()) for r in rows)
    assert any(archive.glob("date=*/*.parquet"))
    with Client(bootstrap) as client:
        assert client.end_offsets("arch") == {0: (25, 25), 1: (25, 25)}  # everything archived is pruned
        assert client.groups.describe("arch", "archive").prune_role == "lead"
