"""Option parsing, admission control and pipeline declarations, without a cluster or Spark."""

from __future__ import annotations

import pytest

from broker.pipeline import Pipeline, topic
from broker.spark.options import EARLIEST, LATEST, SparkOptionError, parse_offsets, reader_options, writer_options
from broker.spark.reader import admit, split

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
