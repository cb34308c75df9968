"""Pipelines on Spark (SPEC §7): the ``raftbroker`` PySpark data source.

``from broker.spark import session``; ``spark = session()`` (``local[*]``, format registered), or
``register(existing_spark)``. Then ``spark.read.format("raftbroker")``, ``readStream``, ``write``
and ``writeStream`` (options in :mod:`broker.spark.options`). Needs the ``spark`` extra
(``pip install 'raftbroker[spark]'``: pyspark and pyarrow) and Java 17.
"""

from broker.spark.options import SparkOptionError
from broker.spark.reader import DataLossError
from broker.spark.source import FORMAT, RaftBrokerDataSource, register, session

__all__ = ["FORMAT", "DataLossError", "RaftBrokerDataSource", "SparkOptionError", "register", "session"]
