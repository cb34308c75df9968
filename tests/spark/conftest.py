"""Fixtures of the Spark tier: one local Spark session per module (``local[2]``, loopback only)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
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


def records_only(items: Iterable[Record | Event]) -> list[Record]:
    """The items of a read that must hold records only: an event fails the test."""
    records: list[Record] = []
    for item in items:
        assert isinstance(item, Record), f"an event among the records: {item!r}"
        records.append(item)
    return records


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A Spark session of the module (``local[2]``) with the raftbroker format registered."""
    from broker.spark import session

    s = session("local[2]", app_name="raftbroker-tests", **{"spark.sql.shuffle.partitions": "2"})
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def bootstrap(cluster: DevCluster) -> str:
    return ",".join(cluster.addresses)
