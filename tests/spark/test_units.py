"""Option parsing, admission control and pipeline declarations, without a cluster or Spark."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from broker.client import Batch
from broker.client import wire as client_wire
from broker.pipeline import Pipeline, topic
from broker.spark.options import EARLIEST, LATEST, SparkOptionError, parse_offsets, reader_options, writer_options
from broker.spark.reader import admit, split
from broker.spark.schema import arrow_schema, batches_to_arrow
from broker.spark.source import compiled_spark_home
from broker.v1 import broker_pb2

pytestmark = pytest.mark.unit


def test_offsets_options() -> None:
    assert parse_offsets("startingOffsets", "earliest", LATEST).default == EARLIEST
    parsed = parse_offsets("startingOffsets", '{"0": 5, "2": -1}', EARLIEST)
    assert parsed.for_partition(0) == 5 and parsed.for_partition(1) == EARLIEST and parsed.for_partition(2) == LATEST
    for bad in ('{"0": 5', "[1]", '{"x": 1}', '{"0": -3}', '{"0": true}'):
        with pytest.raises(SparkOptionError, match="startingOffsets"):
            parse_offsets("startingOffsets", bad, EARLIEST)


def test_reader_and_writer_options() -> None:
    o = reader_options({"BOOTSTRAP": "h:1", "topic": "t", "maxrecordspertrigger": "10"}, streaming=True)
    assert o.starting.default == LATEST and o.max_records_per_trigger == 10 and o.fail_on_data_loss
    assert reader_options({"bootstrap": "h:1", "topic": "t"}, streaming=False).starting.default == EARLIEST
    with pytest.raises(SparkOptionError, match="option 'bootstrap' is required"):
        reader_options({"topic": "t"}, streaming=False)
    with pytest.raises(SparkOptionError, match="not both"):
        reader_options({"bootstrap": "h:1", "topic": "t", "startingOffsets": "earliest",
                        "startingTimestamp": "5"}, streaming=False)
    with pytest.raises(SparkOptionError, match="batch reads only"):
        reader_options({"bootstrap": "h:1", "topic": "t", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(SparkOptionError, match="failOnDataLoss"):
        reader_options({"bootstrap": "h:1", "topic": "t", "failOnDataLoss": "maybe"}, streaming=False)
    with pytest.raises(SparkOptionError, match="at most 10000"):
        writer_options({"bootstrap": "h:1", "topic": "t", "publishBatchRecords": "10001"})


def test_admission_is_bounded_and_fair() -> None:
    assert admit({0: 0, 1: 0, 2: 0}, {0: 100, 1: 100, 2: 100}, 30) == {0: 10, 1: 10, 2: 10}
    assert admit({0: 0, 1: 0}, {0: 2, 1: 100}, 30) == {0: 2, 1: 28}
    assert admit({0: 5}, {0: 5}, 30) == {0: 5}
    got = admit({0: 0, 1: 0, 2: 0}, {0: 1, 1: 1, 2: 1}, 2)
    assert sum(got.values()) == 2
    ranges = split({0: 0, 1: 10}, {0: 95, 1: 10}, 40)
    assert [(r.partition, r.start, r.end) for r in ranges] == [(0, 0, 40), (0, 40, 80), (0, 80, 95)]


def test_pipeline_declarations() -> None:
    a, b, c = topic("a"), topic("b"), topic("c")
    pipeline = Pipeline([b.pipe(str.upper).to(c), a.pipe(str.lower).to(b), a.pipe(len, name="n").to(c)])
    assert [s.target.name for s in pipeline.order()][-1] == "c" and pipeline.order()[0].source.name == "a"
    assert pipeline.mermaid().count("-->") == 3
    with pytest.raises(ValueError, match="cycle"):
        Pipeline([a.pipe(str).to(a)])
    with pytest.raises(ValueError, match="repeated"):
        Pipeline([a.pipe(str).to(b), a.pipe(str).to(b)])
    with pytest.raises(ValueError, match="topic name"):
        topic("bad name")


def _batch(topic: str, partition: int, first: int, values: list[bytes], ts: int) -> Batch:
    msg = broker_pb2.CompactBatch(topic=topic, partition=partition, first_offset=first,
                                  timestamp_counts=[len(values)], timestamps_ms=[ts])
    for i, v in enumerate(values):
        rec = msg.records.add(value=v, origin="c/r" if i else "")
        if i % 2:
            rec.key = b"k%d" % i
            rec.headers["h"] = str(i)
    return client_wire.compact_batch(msg)


def test_batches_become_one_arrow_batch_with_every_column() -> None:
    batches = [_batch("t", 2, 40, [b"a", b"b"], 1_700_000_000_123), _batch("t", 2, 42, [b"c"], 1_700_000_000_124)]
    out = batches_to_arrow(batches, None, arrow_schema(None)).to_pydict()
    assert out["offset"] == [40, 41, 42] and out["partition"] == [2, 2, 2] and out["topic"] == ["t"] * 3
    assert out["value"] == [b"a", b"b", b"c"] and out["key"] == [None, b"k1", None]
    assert out["headers"] == [[], [("h", "1")], []] and out["op"] == ["insert"] * 3
    assert out["origin"] == ["", "c/r", ""]
    assert [t.timestamp() for t in out["timestamp"]] == [1_700_000_000.123, 1_700_000_000.123, 1_700_000_000.124]


def test_json_batches_become_typed_columns_and_a_bad_field_names_its_record() -> None:
    fields = [("n", "integer"), ("s", "string"), ("o", "json")]
    good = _batch("j", 0, 0, [b'{"n": 1, "s": "x", "o": {"a": [1]}}', b'{"s": "y"}'], 5)
    out = batches_to_arrow([good], fields, arrow_schema(fields)).to_pydict()
    assert (out["n"], out["s"], out["o"]) == ([1, None], ["x", "y"], ['{"a": [1]}', None])
    with pytest.raises(ValueError, match=r"j\[0\]@7: field 'n' is not a integer"):
        batches_to_arrow([_batch("j", 0, 7, [b'{"n": "one"}'], 5)], fields, arrow_schema(fields))
    with pytest.raises(ValueError, match=r"j\[0\]@3 is not JSON"):
        batches_to_arrow([_batch("j", 0, 3, [b"nope"], 5)], fields, arrow_schema(fields))


def test_unknown_options_are_refused_naming_them_and_listing_the_known_ones() -> None:
    """A misspelled option (``startingOffset``) was ignored and the whole topic read; now the reader
    and the writer refuse a name they do not know, but let through what Spark adds itself."""
    base = {"bootstrap": "h:1", "topic": "t"}
    for streaming in (False, True):
        with pytest.raises(SparkOptionError) as refused:
            reader_options({**base, "startingoffset": "latest"}, streaming=streaming)
        assert "unknown reader option 'startingoffset' (did you mean 'startingOffsets'?)" in str(refused.value)
        assert "the reader options are bootstrap, topic, startingOffsets, startingTimestamp" in str(refused.value)
    with pytest.raises(SparkOptionError, match="unknown reader option 'publishbatchrecords'"):
        reader_options({**base, "publishbatchrecords": "5"}, streaming=False)
    with pytest.raises(SparkOptionError, match=r"unknown writer option 'startingOffsets'; the writer options are "
                                               r"bootstrap, topic, publishBatchRecords"):
        writer_options({**base, "startingOffsets": "earliest"})
    spark_added = {"path": "/x", "paths": '["/x"]', "checkpointlocation": "/ck", "queryname": "q"}
    assert reader_options({**base, **spark_added}, streaming=True).topic == "t"
    assert writer_options({**base, **spark_added}).publish_batch_records == 500


def test_a_starting_offset_after_the_ending_offset_is_refused() -> None:
    with pytest.raises(SparkOptionError, match="topic 't' partition 0: startingOffsets 500 is after endingOffsets 100"):
        reader_options({"bootstrap": "h:1", "topic": "t", "startingOffsets": '{"0": 500}',
                        "endingOffsets": '{"0": 100}'}, streaming=False)
    same = reader_options({"bootstrap": "h:1", "topic": "t", "startingOffsets": '{"0": 100, "1": -1}',
                           "endingOffsets": '{"0": 100, "1": 5}'}, streaming=False)  # latest: checked at start
    assert same.starting.for_partition(0) == 100


def test_spark_homes_of_installations_that_are_gone_are_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """Each installation of pyspark (each CI checkout's virtualenv) gets a home of links in the temp
    directory; 91 of them had piled up on one machine. The first use of a new one removes those
    whose links point nowhere, and leaves live ones (another installation's) and anything else."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    uid = os.getuid()
    gone = tmp_path / f"raftbroker-spark-home-{uid}-0.0.0-dead"
    gone.mkdir()
    (gone / "jars").symlink_to(tmp_path / "removed-venv" / "jars")
    live = tmp_path / f"raftbroker-spark-home-{uid}-0.0.0-live"
    (tmp_path / "other-venv" / "jars").mkdir(parents=True)
    live.mkdir()
    (live / "jars").symlink_to(tmp_path / "other-venv" / "jars")
    someone_else = tmp_path / f"raftbroker-spark-home-{uid + 1}-0.0.0-dead"
    someone_else.mkdir()
    home = Path(compiled_spark_home())
    assert (home / "jars").is_dir() and home.parent == tmp_path
    assert not gone.exists() and live.exists() and someone_else.exists()
