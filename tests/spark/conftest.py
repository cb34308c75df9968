"""Fixtures of the Spark tier: one local Spark session per module (``local[2]``, loopback only)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from broker.devcluster import DevCluster

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

try:
    import pyspark  # noqa: F401
except ImportError:  # never skip silently: the tier needs the extra (make test installs it)
    raise RuntimeError("the spark tier needs pyspark and pyarrow: pip install -e '.[spark]' (make spark)") from None

from pyspark.sql import SparkSession  # noqa: E402

from broker.spark import session  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """A Spark session of the module (``local[2]``) with the raftbroker format registered."""
    s = session("local[2]", app_name="raftbroker-tests", **{"spark.sql.shuffle.partitions": "2"})
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def bootstrap(cluster: DevCluster) -> str:
    return ",".join(cluster.addresses)
