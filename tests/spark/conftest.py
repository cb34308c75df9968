"""Fixtures of the Spark tier: one local Spark session per module (``local[2]``, loopback only), and one
scratch directory for the session that every Spark process of the tier uses as its temp directory."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import Event, Record
from broker.devcluster import DevCluster

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

try:
    import pyspark  # noqa: F401 (only whether the spark extra is installed matters here)
except ImportError:
    spark_installed = False
else:
    spark_installed = True

# Without the `spark` extra the other tiers still collect (this directory is left out), but asking
# for the spark tier fails loudly instead of skipping (make spark / make test install the extra).
collect_ignore_glob: list[str] = [] if spark_installed else ["test_*.py"]


def pytest_configure(config: pytest.Config) -> None:
    wanted = "spark" in (config.option.markexpr or "") or any("tests/spark" in str(a) for a in config.args)
    if not spark_installed and wanted:
        raise pytest.UsageError("the spark tier needs pyspark and pyarrow: pip install -e '.[spark]' (make spark)")


SCRATCH_PREFIX = "raftbroker-spark-tests-"
_scratch: Path | None = None  # the session's scratch directory while spark_scratch is active


def _sweep_stale_scratch(root: Path) -> None:
    """Remove the scratch directories of earlier runs whose pytest died before its teardown (named by its pid)."""
    for old in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = old.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or old.stat().st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except PermissionError:  # alive, someone else's
            pass


@pytest.fixture(scope="session", autouse=True)
def spark_scratch() -> Iterator[Path]:
    """One temp directory for the session, removed at its end (pass or fail): what Spark puts in the
    temp directory (spark-*, blockmgr-*, artifacts-*, liblz4-java-*.so) goes there, also from the
    drivers, masters and workers a test kills, whose shutdown hooks never run.

    Every JVM started from here on (the gateway of this process's sessions, and those of the
    drivers, master and worker the tests start, and the executors a worker starts: they all inherit
    the environment) gets ``-Djava.io.tmpdir`` and ``-XX:-UsePerfData`` (no /tmp/hsperfdata_<user>/<pid>
    file, which a killed JVM leaves) through JAVA_TOOL_OPTIONS, and SPARK_LOCAL_DIRS. Python
    processes a test starts get TMPDIR too (:func:`spark_env`); this process keeps its own temp
    directory, so the SPARK_HOME cache of :func:`broker.spark.source.compiled_spark_home` stays where
    it is reused across runs: it is made here, before any test, and handed down in SPARK_HOME."""
    global _scratch
    from broker.spark.source import compiled_spark_home

    root = Path(tempfile.gettempdir())
    _sweep_stale_scratch(root)
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=root))
    java_options = [os.environ.get("JAVA_TOOL_OPTIONS", ""), f"-Djava.io.tmpdir={scratch}", "-XX:-UsePerfData"]
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("SPARK_HOME", os.environ.get("SPARK_HOME") or compiled_spark_home())
            env.setenv("SPARK_LOCAL_DIRS", str(scratch))
            env.setenv("JAVA_TOOL_OPTIONS", " ".join(o for o in java_options if o))
            _scratch = scratch
            yield scratch
    finally:
        _scratch = None
        shutil.rmtree(scratch, ignore_errors=True)


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts (a driver, the CLI, a standalone master or worker):
    this process's (with what :func:`spark_scratch` set), Spark on loopback with this Python, TMPDIR
    in the session's scratch directory, and ``extra``."""
    assert _scratch is not None, "spark_env needs the spark_scratch fixture (autouse in tests/spark)"
    return dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, TMPDIR=str(_scratch),
                **extra)


def records_only(items: Iterable[Record | Event]) -> list[Record]:
    """The items of a read that must hold records only: an event fails the test."""
    records: list[Record] = []
    for item in items:
        assert isinstance(item, Record), f"an event among the records: {item!r}"
        records.append(item)
    return records


@pytest.fixture(scope="module")
def spark(spark_scratch: Path) -> Iterator[Any]:
    """A Spark session of the module (``local[2]``) with the raftbroker format registered (its Python
    workers get TMPDIR in the scratch directory: they inherit this process's environment otherwise)."""
    from broker.spark import session

    s = session("local[2]", app_name="raftbroker-tests",
                **{"spark.sql.shuffle.partitions": "2", "spark.executorEnv.TMPDIR": str(spark_scratch)})
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def bootstrap(cluster: DevCluster) -> str:
    return ",".join(cluster.addresses)
