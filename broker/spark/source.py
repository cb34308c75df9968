"""The ``raftbroker`` PySpark data source, and a local Spark session that has it registered.

``spark.read.format("raftbroker").option("bootstrap", "h1:p,h2:p").option("topic", "t").load()``;
``readStream``, ``df.write`` and ``writeStream`` alike (options: :mod:`broker.spark.options`).
Options and the topic are checked on the driver when the query is defined or started, so a bad
option or an unknown topic fails there with a message naming it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from broker.client import Client, TopicNotFound
from broker.spark.options import SparkOptionError, reader_options, writer_options
from broker.spark.reader import BatchReader, StreamReader
from broker.spark.schema import json_fields, spark_schema
from broker.spark.writer import BatchWriter, StreamWriter

FORMAT = "raftbroker"
DEFAULT_MASTER = "local[*]"


def topic_info_or_fail(bootstrap: str, topic: str) -> Any:
    """The topic's description; an unknown topic or unreachable cluster is a clear driver error."""
    try:
        with Client(bootstrap, retry_deadline_s=10.0) as client:
            return client.describe_topic(topic)
    except TopicNotFound:
        raise SparkOptionError(f"raftbroker: topic {topic!r} does not exist (bootstrap {bootstrap})") from None


class RaftBrokerDataSource(DataSource):
    """Topics of a raftbroker cluster as a Spark source and sink (SPEC §7)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _fields(self) -> list[tuple[str, str]] | None:
        o = reader_options(self.options, streaming=False)
        if o.value_format != "json":
            return None
        return json_fields(o.topic, topic_info_or_fail(o.bootstrap, o.topic).schema_json)

    def schema(self) -> StructType:
        """Called by ``load()`` on the driver: bad options or an unknown topic fail right there."""
        o = reader_options(self.options, streaming=False)
        info = topic_info_or_fail(o.bootstrap, o.topic)
        return spark_schema(json_fields(o.topic, info.schema_json) if o.value_format == "json" else None)

    def reader(self, schema: StructType) -> DataSourceReader:
        o = reader_options(self.options, streaming=False)
        topic_info_or_fail(o.bootstrap, o.topic)
        return BatchReader(o, self._fields())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        o = reader_options(self.options, streaming=True)
        topic_info_or_fail(o.bootstrap, o.topic)
        return StreamReader(o, self._fields())

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        o = writer_options(self.options)
        _check_input(schema, overwrite)
        topic_info_or_fail(o.bootstrap, o.topic)
        return BatchWriter(o)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        o = writer_options(self.options)
        _check_input(schema, overwrite)
        topic_info_or_fail(o.bootstrap, o.topic)
        return StreamWriter(o)


_TEXT = (BinaryType, StringType)
_INTEGERS = (ByteType, ShortType, IntegerType, LongType)


def _check_input(schema: StructType, overwrite: bool) -> None:
    """On the driver, before any task runs: what the writer would refuse row by row in an executor."""
    if overwrite:  # a topic is a log: replacing its records is not a write (clear it first)
        raise SparkOptionError("raftbroker: mode 'overwrite' is not supported: a topic is appended to; write with "
                               "mode('append') (to replace what a topic holds, 'raftbroker topic clear' it first)")
    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise SparkOptionError(f"raftbroker: the DataFrame to write needs a 'value' column; it has {sorted(types)}")
    wanted: dict[str, tuple[tuple[type[DataType], ...], str]] = {
        "value": (_TEXT, "binary or string"), "key": (_TEXT, "binary or string"),
        "headers": ((MapType,), "map<string,string>"), "partition": (_INTEGERS, "an integer")}
    for name, (kinds, said) in wanted.items():
        if name in types and not isinstance(types[name], kinds):
            raise SparkOptionError(f"raftbroker: column {name!r} must be {said}, got {types[name].simpleString()}"
                                   + (f" (cast it: col('{name}').cast('string'))" if kinds is _TEXT else ""))


def register(spark: SparkSession) -> SparkSession:
    """Register the ``raftbroker`` format with ``spark``; returns it for chaining."""
    spark.dataSource.register(RaftBrokerDataSource)
    return spark


SPARK_HOME_LINKS = ("bin", "jars", "sbin", "conf", "data", "examples", "licenses")


def compiled_spark_home() -> str:
    """A SPARK_HOME for the installed pyspark whose Python workers import pyspark from the
    installed, byte-compiled package instead of ``python/lib/pyspark.zip`` (every worker would
    compile the zip's modules again: three times the CPU, which on a loaded machine exceeds the
    JVM's fixed 10 s wait for a worker to connect back). It holds links to pyspark's directories
    except ``python/``; created once per user and installation under the temp directory, where the
    homes of installations that are gone are removed."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    digest = hashlib.sha256(str(package).encode()).hexdigest()[:12]  # one per installation: links name it
    home = Path(tempfile.gettempdir()) / f"raftbroker-spark-home-{os.getuid()}-{pyspark.__version__}-{digest}"
    if not (home / "jars").exists():
        # this installation's first use: homes whose installation is gone (a removed virtualenv, a
        # CI checkout) are links to nothing, one more per installation ever used: remove them
        for other in home.parent.glob(f"raftbroker-spark-home-{os.getuid()}-*"):
            if other.is_dir() and not other.is_symlink() and not (other / "jars").exists():
                shutil.rmtree(other, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix="raftbroker-spark-home-"))
        for name in SPARK_HOME_LINKS:
            if (package / name).exists():
                (staging / name).symlink_to(package / name)
        try:
            staging.rename(home)
        except OSError:  # another process made it first
            shutil.rmtree(staging, ignore_errors=True)
    return str(home)


def session(master: str = DEFAULT_MASTER, app_name: str = "raftbroker", **conf: str) -> SparkSession:
    """A Spark session on ``master`` with the format registered. Executors use this Python
    (``PYSPARK_PYTHON`` unless set) and Spark stays on loopback unless ``SPARK_LOCAL_IP`` says
    otherwise. ``conf``: extra Spark settings (``spark.sql.shuffle.partitions="2"``, ...)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_HOME", compiled_spark_home())
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name)
    builder = builder.config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return register(builder.getOrCreate())
