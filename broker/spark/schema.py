"""The columns a topic reads as, in Spark and in Arrow, and SDK batches turned into Arrow batches.

Binary format: ``topic, partition, offset, key, value, headers, timestamp, op, origin``.
JSON format (a typed topic, ``valueFormat=json``): the same without ``value``, followed by one
column per property of the topic's JSON Schema (string, integer, number, boolean; objects and
arrays as their JSON text). A document that is not JSON, or whose field has another type, fails
the read with a message naming the record (a typed topic's server already rejects such values).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.client.models import Batch
from broker.spark.options import SparkOptionError

META_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp", "op", "origin")
_JSON_TYPES: dict[str, tuple[DataType, pa.DataType]] = {
    "string": (StringType(), pa.string()),
    "integer": (LongType(), pa.int64()),
    "number": (DoubleType(), pa.float64()),
    "boolean": (BooleanType(), pa.bool_()),
}
_META: list[tuple[str, DataType, pa.DataType, bool]] = [
    ("topic", StringType(), pa.string(), False),
    ("partition", IntegerType(), pa.int32(), False),
    ("offset", LongType(), pa.int64(), False),
    ("key", BinaryType(), pa.binary(), True),
    ("value", BinaryType(), pa.binary(), True),
    ("headers", MapType(StringType(), StringType(), True), pa.map_(pa.string(), pa.string()), True),
    ("timestamp", TimestampType(), pa.timestamp("us", tz="UTC"), False),
    ("op", StringType(), pa.string(), False),
    ("origin", StringType(), pa.string(), False),
]


def json_fields(topic: str, schema_json: str) -> list[tuple[str, str]]:
    """``[(name, json type)]`` of a typed topic's top-level properties, in schema order; a
    property without a plain scalar type is read as its JSON text ("json")."""
    if not schema_json:
        raise SparkOptionError(f"raftbroker: valueFormat=json needs a typed topic, but {topic!r} has no JSON Schema")
    schema = json.loads(schema_json)
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not properties:
        raise SparkOptionError(f"raftbroker: the JSON Schema of {topic!r} declares no properties to read as columns")
    fields: list[tuple[str, str]] = []
    for name, spec in properties.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        if name in META_COLUMNS:
            raise SparkOptionError(f"raftbroker: field {name!r} of {topic!r} clashes with the record column "
                                   f"of that name; read it with valueFormat=binary")
        fields.append((name, kind if isinstance(kind, str) and kind in _JSON_TYPES else "json"))
    return fields


def spark_schema(fields: Sequence[tuple[str, str]] | None) -> StructType:
    """The Spark schema of the binary format (``fields`` None) or of the JSON format."""
    columns = [StructField(n, t, nullable) for n, t, _, nullable in _META if fields is None or n != "value"]
    for name, kind in fields or ():
        columns.append(StructField(name, _JSON_TYPES.get(kind, (StringType(), pa.string()))[0], True))
    return StructType(columns)


def arrow_schema(fields: Sequence[tuple[str, str]] | None) -> pa.Schema:
    """The Arrow schema matching :func:`spark_schema`."""
    columns = [pa.field(n, t, nullable) for n, _, t, nullable in _META if fields is None or n != "value"]
    for name, kind in fields or ():
        columns.append(pa.field(name, _JSON_TYPES.get(kind, (StringType(), pa.string()))[1], True))
    return pa.schema(columns)


def _json_value(where: tuple[str, int, int], name: str, kind: str, document: dict[str, Any]) -> Any:
    value = document.get(name)
    if value is None:
        return None
    if kind == "json":
        return json.dumps(value)
    ok = {"string": isinstance(value, str), "boolean": isinstance(value, bool),
          "integer": isinstance(value, int) and not isinstance(value, bool),
          "number": isinstance(value, int | float) and not isinstance(value, bool)}[kind]
    if not ok:
        topic, partition, offset = where
        raise ValueError(f"raftbroker: {topic}[{partition}]@{offset}: field {name!r} is not a {kind}: {value!r}")
    return float(value) if kind == "number" else value


def batches_to_arrow(batches: Sequence[Batch], fields: Sequence[tuple[str, str]] | None, schema: pa.Schema
                     ) -> pa.RecordBatch:
    """One Arrow batch of the records of ``batches`` (``Client.read_range_batches``) in the format
    of ``fields`` (see :func:`spark_schema`): each column is built a batch at a time, with no
    object per record."""
    columns: dict[str, list[Any]] = {name: [] for name in META_COLUMNS}
    for b in batches:
        n = len(b)
        columns["topic"] += [b.topic] * n
        columns["partition"] += [b.partition] * n
        columns["offset"] += b.offsets
        columns["key"] += b.keys()
        columns["value"] += b.values
        columns["headers"] += [list(h.items()) for h in b.headers()]
        columns["timestamp"] += b.timestamps_ms
        columns["op"] += b.ops()
        columns["origin"] += b.origins()
    return _arrow(columns, fields, schema)


def _arrow(columns: dict[str, list[Any]], fields: Sequence[tuple[str, str]] | None, schema: pa.Schema
           ) -> pa.RecordBatch:
    """The Arrow batch of the record columns (timestamps in ms), in the format of ``fields``."""
    arrays: dict[str, Any] = dict(columns)
    arrays["timestamp"] = pa.array([ms * 1000 for ms in columns["timestamp"]], pa.timestamp("us", tz="UTC"))
    if fields is not None:
        documents = []
        for topic, partition, offset, value in zip(columns["topic"], columns["partition"], columns["offset"],
                                                   columns["value"], strict=True):
            try:
                document = json.loads(value)
            except ValueError:
                raise ValueError(f"raftbroker: {topic}[{partition}]@{offset} is not JSON") from None
            documents.append(document if isinstance(document, dict) else {})
        places = list(zip(columns["topic"], columns["partition"], columns["offset"], strict=True))
        for name, kind in fields:
            arrays[name] = [_json_value(w, name, kind, d) for w, d in zip(places, documents, strict=True)]
    return pa.RecordBatch.from_pydict({f.name: arrays[f.name] for f in schema}, schema=schema)
