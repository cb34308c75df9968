"""The raftbroker data source against a real 3-node cluster: batch and stream reads, data loss,
typed columns, and bad options failing on the driver with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from broker.client import Client
from broker.pipeline.runner import RESTARTS_MAX, transient
from tests.spark.conftest import records_only

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]


def reader(spark: SparkSession, bootstrap: str, topic: str, **options: Any) -> DataFrame:
    r = spark.read.format("raftbroker").option("bootstrap", bootstrap).option("topic", topic)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def fill(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    with Client(bootstrap) as client:
        client.create_topic(topic, partitions)
        for p in range(partitions):
            client.publish_batch(topic, [{"value": f"{p}-{i}", "partition": p, "key": f"k{i % 7}",
                                          "headers": {"i": str(i)}} for i in range(per_partition)])


def test_batch_read_equals_cli_consume_per_partition(spark: SparkSession, bootstrap: str) -> None:
    fill(bootstrap, "three", 3, 150)
    df = reader(spark, bootstrap, "three", maxRecordsPerPartition="40")
    assert df.rdd.getNumPartitions() == 12  # 3 topic partitions, each split into 4 ranges of <= 40
    rows = df.collect()
    cli = subprocess.run([sys.executable, "-m", "broker.cli.main", "--bootstrap", bootstrap, "--json",
                          "consume", "three"], capture_output=True, text=True, timeout=120, check=True)
    consumed = [json.loads(line) for line in cli.stdout.splitlines() if line.strip()]
    assert len(rows) == len(consumed) == 450
    for p in range(3):
        spark_side = [(r.offset, r.value.decode(), r.key.decode(), r.headers) for r in rows if r.partition == p]
        cli_side = [(c["offset"], c["value"], c["key"], c["headers"]) for c in consumed if c["partition"] == p]
        assert spark_side == cli_side  # same records, same order
    assert {r.topic for r in rows} == {"three"} and {r.op for r in rows} == {"insert"}


def test_starting_and_ending_offsets_and_timestamp(spark: SparkSession, bootstrap: str) -> None:
    fill(bootstrap, "bounds", 2, 30)
    df = reader(spark, bootstrap, "bounds", startingOffsets='{"0": 10}', endingOffsets='{"0": 20, "1": 5}')
    got = sorted((r.partition, r.offset) for r in df.collect())
    assert got == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(5)]
    with Client(bootstrap) as client:
        later = client.publish_batch("bounds", [{"value": f"late-{i}", "partition": i % 2} for i in range(6)])
        stamp = later[0].timestamp_ms
        everything = records_only(client.subscribe("bounds", stop_at_end=True))
    expected = sorted((r.partition, r.offset) for r in everything if r.timestamp_ms >= stamp)
    got = sorted((r.partition, r.offset) for r in reader(spark, bootstrap, "bounds",
                                                          startingTimestamp=str(stamp)).collect())
    assert got == expected and len(got) >= 6


def run_stream(spark: SparkSession, bootstrap: str, topic: str, checkpoint: Path, **options: str
               ) -> dict[int, list[tuple[int, int]]]:
    """One AvailableNow run; returns the (partition, offset) pairs of each micro-batch."""
    batches: dict[int, list[tuple[int, int]]] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        batches[batch_id] = [(r.partition, r.offset) for r in df.select("partition", "offset").collect()]

    stream = spark.readStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", topic)
    for key, value in options.items():
        stream = stream.option(key, value)
    for attempt in range(1, RESTARTS_MAX + 2):
        query = (stream.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination(600)
            break
        except Exception as err:  # the query failed: its message is what a test may look for
            if attempt > RESTARTS_MAX or not transient(err):  # a slow Python worker start: restart
                raise AssertionError(str(err)) from None
    assert not query.isActive, "the AvailableNow query did not finish"
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return batches


def test_stream_bounded_batches_and_restart_reads_only_new(spark: SparkSession, bootstrap: str,
                                                            tmp_path: Path) -> None:
    fill(bootstrap, "flow", 3, 40)
    first = run_stream(spark, bootstrap, "flow", tmp_path / "ck", startingOffsets="earliest",
                       maxRecordsPerTrigger="25")
    assert all(len(rows) <= 25 for rows in first.values()) and len(first) >= 5
    seen = sorted(pair for rows in first.values() for pair in rows)
    assert seen == sorted((p, o) for p in range(3) for o in range(40))
    with Client(bootstrap) as client:
        client.publish_batch("flow", [{"value": f"new-{i}", "partition": i % 3} for i in range(9)])
    second = run_stream(spark, bootstrap, "flow", tmp_path / "ck", startingOffsets="earliest",
                        maxRecordsPerTrigger="25")
    assert min(second) > max(first)
    assert sorted(pair for rows in second.values() for pair in rows) == sorted(
        (p, o) for p in range(3) for o in range(40, 43))


def test_fail_on_data_loss_both_ways(spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    fill(bootstrap, "lossy", 1, 100)
    first = run_stream(spark, bootstrap, "lossy", tmp_path / "ck", startingOffsets="earliest",
                       maxRecordsPerTrigger="100")
    assert sum(len(rows) for rows in first.values()) == 100
    with Client(bootstrap) as client:
        client.publish_batch("lossy", [{"value": f"more-{i}"} for i in range(20)])
        assert client.prune("lossy", 110, partition=0) == 110
    with pytest.raises(Exception) as failed:
        reader(spark, bootstrap, "lossy", startingOffsets='{"0": 10}').collect()
    assert "topic 'lossy' partition 0: offsets [10, 110) are no longer in the log" in str(failed.value)
    skipped = reader(spark, bootstrap, "lossy", startingOffsets='{"0": 10}', failOnDataLoss="false").collect()
    assert [r.offset for r in skipped] == list(range(110, 120))
    with pytest.raises(AssertionError) as stream_failed:  # the checkpoint resumes at 100, pruned
        run_stream(spark, bootstrap, "lossy", tmp_path / "ck")
    assert "offsets [100, 110) are no longer in the log" in str(stream_failed.value)
    resumed = run_stream(spark, bootstrap, "lossy", tmp_path / "ck", failOnDataLoss="false")
    assert sorted(pair for rows in resumed.values() for pair in rows) == [(0, o) for o in range(110, 120)]


def test_typed_topic_reads_as_columns(spark: SparkSession, bootstrap: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer"},
                                               "price": {"type": "number"}, "paid": {"type": "boolean"},
                                               "tags": {"type": "array"}}, "required": ["name"]}
    with Client(bootstrap) as client:
        client.create_topic("orders", 1, schema=schema)
        client.publish_batch("orders", [json.dumps({"name": "a", "qty": 2, "price": 1.5, "paid": True,
                                                    "tags": ["x"]}), json.dumps({"name": "b"})])
    df = reader(spark, bootstrap, "orders", valueFormat="json")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types["name"] == "string" and types["qty"] == "bigint" and types["price"] == "double"
    assert types["paid"] == "boolean" and types["tags"] == "string" and "value" not in types
    rows = df.orderBy("offset").collect()
    assert (rows[0].name, rows[0].qty, rows[0].price, rows[0].paid, json.loads(rows[0].tags)) == (
        "a", 2, 1.5, True, ["x"])
    assert (rows[1].name, rows[1].qty, rows[1].paid) == ("b", None, None)
    assert df.filter("qty > 1").count() == 1


@pytest.mark.parametrize(("options", "message"), [
    ({"topic": "three"}, "option 'bootstrap' is required"),
    ({"topic": "no-such-topic"}, "topic 'no-such-topic' does not exist"),
    ({"topic": "three", "startingOffsets": '{"0": 5'}, "option 'startingOffsets' is neither earliest, latest"),
    ({"topic": "three", "startingOffsets": '{"9": 5}'}, "names partition(s) [9] that topic 'three' does not have"),
    ({"topic": "three", "maxRecordsPerPartition": "0"}, "option 'maxRecordsPerPartition' must be > 0"),
    ({"topic": "three", "valueFormat": "json"}, "valueFormat=json needs a typed topic"),
    ({"topic": "three", "startingOffset": "latest"}, "unknown reader option 'startingoffset' (did you mean "
                                                     "'startingOffsets'?); the reader options are bootstrap, topic"),
    ({"topic": "three", "startingOffsets": '{"0": 99999}'}, "asks for offset 99999 of topic 'three' partition 0, "
                                                           "past its end"),
    ({"topic": "three", "startingOffsets": '{"0": 500}', "endingOffsets": '{"0": 100}'},
     "topic 'three' partition 0: startingOffsets 500 is after endingOffsets 100"),
])
def test_bad_options_fail_at_query_start(spark: SparkSession, bootstrap: str, options: dict[str, str],
                                         message: str) -> None:
    with Client(bootstrap) as client:
        client.create_topic("three", 3, exist_ok=True)
    r = spark.read.format("raftbroker")
    if "bootstrap" not in message:
        r = r.option("bootstrap", bootstrap)
    for key, value in options.items():
        r = r.option(key, value)
    with pytest.raises(Exception) as failed:
        r.load().collect()
    text = str(failed.value)
    assert message in text
    assert "stage failure" not in text and "Task " not in text  # the driver refused it, no executor ran


def test_bad_stream_options_fail_at_start(spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    with Client(bootstrap) as client:
        client.create_topic("three", 3, exist_ok=True)
    with pytest.raises(Exception) as failed:  # load() checks, before any query exists
        spark.readStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", "nope").load()
    assert "topic 'nope' does not exist" in str(failed.value)
    source = (spark.readStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", "three")
              .option("startingOffsets", "earliest").load().select("value"))
    with pytest.raises(Exception) as failed:  # the sink is made when the query starts, on the driver
        query = source.writeStream.format("raftbroker").option("topic", "three").option(
            "checkpointLocation", str(tmp_path / "w")).start()
        query.awaitTermination(600)
    assert "option 'bootstrap' is required" in str(failed.value)
    assert "stage failure" not in str(failed.value)  # no task ran
    with Client(bootstrap) as client:
        assert client.end_offsets("three")[0][1] in (0, 150)  # nothing was written


def test_a_batch_write_appends_every_column_and_refuses_overwrite_and_bad_types_on_the_driver(
        spark: SparkSession, bootstrap: str) -> None:
    """``df.write`` in append mode stores each row once with its key, headers and partition. An
    overwrite (which would otherwise append silently) and a column of the wrong type are refused
    before any task runs, and store nothing."""
    with Client(bootstrap) as client:
        client.create_topic("written", 2)
    rows = spark.createDataFrame([("a", "k1", {"h": "1"}, 0), ("b", None, None, 1), ("c", "k2", {}, 1)],
                                 "value string, key string, headers map<string,string>, partition int")

    def write(df: DataFrame, mode: str) -> None:
        df.write.format("raftbroker").mode(mode).option("bootstrap", bootstrap).option("topic", "written").save()

    write(rows, "append")
    with Client(bootstrap) as client:
        stored = sorted((r.partition, r.value, r.key, r.headers) for r in records_only(
            client.subscribe("written", stop_at_end=True)))
    assert stored == [(0, b"a", b"k1", {"h": "1"}), (1, b"b", None, {}), (1, b"c", b"k2", {})]
    for df, mode, message in [
            (rows, "overwrite", "mode 'overwrite' is not supported"),
            (spark.createDataFrame([(5,)], "value int"), "append", "column 'value' must be binary or string, got int"),
            (spark.createDataFrame([("v", "0")], "value string, partition string"), "append",
             "column 'partition' must be an integer, got string")]:
        with pytest.raises(Exception) as failed:
            write(df, mode)
        assert message in str(failed.value)
        assert "stage failure" not in str(failed.value) and "Task " not in str(failed.value), "no executor ran"
    with Client(bootstrap) as client:
        assert [end for _, (_, end) in sorted(client.end_offsets("written").items())] == [1, 2], "nothing more stored"


def test_start_offsets_past_the_end_or_after_the_ending_offset_are_refused_on_the_driver(
        spark: SparkSession, bootstrap: str, tmp_path: Path) -> None:
    """A start past a partition's end read nothing from it, silently; now it is refused naming the
    partition and the offsets (batch and stream), unless failOnDataLoss=false: then the partition
    starts at its end. A start after the ending offset is refused whatever failOnDataLoss says."""
    fill(bootstrap, "ranged", 2, 20)
    for stream in (False, True):
        with pytest.raises(Exception) as failed:
            if stream:
                run_stream(spark, bootstrap, "ranged", tmp_path / "refused", startingOffsets='{"0": 99999}')
            else:
                reader(spark, bootstrap, "ranged", startingOffsets='{"0": 99999}').collect()
        text = str(failed.value)
        assert "asks for offset 99999 of topic 'ranged' partition 0, past its end 20" in text
        assert "set failOnDataLoss=false" in text and "stage failure" not in text and "Task " not in text
    with pytest.raises(Exception) as failed:
        reader(spark, bootstrap, "ranged", startingOffsets="latest", endingOffsets='{"0": 5}').collect()
    assert "topic 'ranged' partition 0: the starting offset 20 (startingOffsets) is after the ending offset 5" in str(
        failed.value)
    lenient = {"startingOffsets": '{"0": 99999, "1": -2}', "failOnDataLoss": "false"}
    rows = reader(spark, bootstrap, "ranged", **lenient).collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(1, o) for o in range(20)]
    first = run_stream(spark, bootstrap, "ranged", tmp_path / "lenient", **lenient)
    assert sorted(pair for rows in first.values() for pair in rows) == [(1, o) for o in range(20)]
    with Client(bootstrap) as client:
        client.publish_batch("ranged", [{"value": f"new-{i}", "partition": 0} for i in range(3)])
    second = run_stream(spark, bootstrap, "ranged", tmp_path / "lenient", **lenient)
    assert sorted(pair for rows in second.values() for pair in rows) == [(0, o) for o in range(20, 23)]


def test_unknown_options_are_refused_by_every_reader_and_writer(spark: SparkSession, bootstrap: str,
                                                                tmp_path: Path) -> None:
    """A misspelled option is refused by read, readStream, write and writeStream on the driver
    (naming it and the known ones), and nothing is read or written."""
    with Client(bootstrap) as client:
        client.create_topic("spelled", 1, exist_ok=True)
        client.publish("spelled", b"one")
    with pytest.raises(Exception) as failed:
        spark.readStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", "spelled").option(
            "maxRecordPerTrigger", "5").load()
    assert "unknown reader option 'maxrecordpertrigger' (did you mean 'maxRecordsPerTrigger'?)" in str(failed.value)
    rows = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception) as failed:
        rows.write.format("raftbroker").mode("append").option("bootstrap", bootstrap).option("topic", "spelled") \
            .option("startingOffsets", "earliest").save()
    assert "unknown writer option 'startingoffsets'; the writer options are bootstrap, topic, publishBatchRecords" \
        in str(failed.value)
    source = (spark.readStream.format("raftbroker").option("bootstrap", bootstrap)
              .option("topic", "spelled").option("startingOffsets", "earliest").load().select("value"))
    with pytest.raises(Exception) as failed:
        query = (source.writeStream.format("raftbroker").option("bootstrap", bootstrap).option("topic", "spelled")
                 .option("publishBatchRecord", "10").option("checkpointLocation", str(tmp_path / "w"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(600)
    assert "unknown writer option 'publishbatchrecord' (did you mean 'publishBatchRecords'?)" in str(failed.value)
    assert "stage failure" not in str(failed.value)
    with Client(bootstrap) as client:
        assert client.end_offsets("spelled") == {0: (0, 1)}, "nothing was written"
