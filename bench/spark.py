"""``python -m bench.spark``: Spark throughput against a local 3-node cluster (issue 16 item 8).

1. Batch read: N records of 100 bytes in a 3-partition topic read into Spark
   (``spark.read.format("raftbroker")``, split by ``maxRecordsPerPartition``, counted by a no-op
   sink), in records/s, and the ratio to ``raftbroker consume`` of the same records (the CLI
   printing JSON lines to /dev/null).
2. A two-stage pipeline (source -> stage 1 -> middle -> stage 2 -> target, exactly-once writes)
   run until caught up over M records: end-to-end records/s.

Times exclude starting the cluster, publishing, and starting the Spark session and its first
query (JVM warm-up, Python workers). Prints a table and writes ``bench/results/spark-latest.json``.
``--records N`` and ``--pipeline-records M`` change the sizes (defaults 1,000,000 and 100,000);
``--master`` the Spark master.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.client import Client, Record
from broker.devcluster import DevCluster

RESULTS = Path(__file__).resolve().parent / "results"
VALUE_BYTES = 100
PUBLISH_BATCH_RECORDS = 5000


def publish(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    """Publish ``records`` values of 100 bytes spread over the partitions; returns seconds."""
    value = b"x" * VALUE_BYTES
    started = time.monotonic()

    def fill(partition: int) -> None:
        with Client(bootstrap, timeout_s=60) as client:
            count = records // partitions + (1 if partition < records % partitions else 0)
            for first in range(0, count, PUBLISH_BATCH_RECORDS):
                n = min(PUBLISH_BATCH_RECORDS, count - first)
                client.publish_batch(topic, [{"value": value, "partition": partition}] * n)

    with ThreadPoolExecutor(partitions) as pool:
        list(pool.map(fill, range(partitions)))
    return time.monotonic() - started


def upper(record: Record) -> bytes:
    """Stage 1 of the benchmark pipeline."""
    return record.value.upper()


def lower(record: Record) -> bytes:
    """Stage 2 of the benchmark pipeline."""
    return record.value.lower()


def cli_consume_s(bootstrap: str, topic: str) -> float:
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "broker.cli.main", "--bootstrap", bootstrap, "--json", "consume", topic],
                   stdout=subprocess.DEVNULL, check=True)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--pipeline-records", type=int, default=100_000)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)
    from pyspark.sql import functions as F

    from broker.pipeline import Pipeline, topic
    from broker.spark import session

    results: dict[str, float] = {"records": args.records, "pipeline_records": args.pipeline_records}
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp, DevCluster(3, Path(tmp)) as cluster:
        cluster.wait_ready(120)
        bootstrap = ",".join(cluster.addresses)
        with Client(bootstrap) as client:
            for name in ("bench", "p-src", "p-mid", "p-out"):
                client.create_topic(name, 3)
        results["publish_s"] = publish(bootstrap, "bench", args.records, 3)
        results["cli_consume_s"] = cli_consume_s(bootstrap, "bench")
        spark = session(args.master, app_name="raftbroker-bench")
        # a first query pays the JVM's warm-up and the Python workers' start (a cold 300k read ran at
        # 7.3k records/s, the same read warm at 15-18k here): start-up, like the session's, untimed
        warm = spark.read.format("raftbroker").option("bootstrap", bootstrap).option("topic", "bench").load()
        warm.limit(1).count()
        started = time.monotonic()
        df = (spark.read.format("raftbroker").option("bootstrap", bootstrap).option("topic", "bench")
              .option("maxRecordsPerPartition", str(max(1, args.records // 12))).load())
        read = df.agg(F.count("*"), F.sum(F.length("value"))).collect()[0]
        results["spark_read_s"] = time.monotonic() - started
        assert read[0] == args.records, f"Spark read {read[0]} records of {args.records}"
        publish(bootstrap, "p-src", args.pipeline_records, 3)
        started = time.monotonic()
        stages = [topic("p-src").pipe(upper).to(topic("p-mid")), topic("p-mid").pipe(lower).to(topic("p-out"))]
        Pipeline(stages, name="bench").run(bootstrap=bootstrap, spark=spark, checkpoint=Path(tmp) / "ck")
        results["pipeline_s"] = time.monotonic() - started
        with Client(bootstrap) as client:
            assert client.describe_topic("p-out").records == args.pipeline_records
        spark.stop()
    results["spark_read_records_per_s"] = args.records / results["spark_read_s"]
    results["cli_consume_records_per_s"] = args.records / results["cli_consume_s"]
    results["spark_to_cli_ratio"] = results["cli_consume_s"] / results["spark_read_s"]
    results["pipeline_records_per_s"] = args.pipeline_records / results["pipeline_s"]
    print(f"Spark batch read of {args.records:,} x {VALUE_BYTES} B from 3 nodes: "
          f"{results['spark_read_records_per_s']:,.0f} records/s ({results['spark_read_s']:.1f} s)")
    print(f"raftbroker consume of the same records: {results['cli_consume_records_per_s']:,.0f} records/s "
          f"({results['cli_consume_s']:.1f} s); Spark / consume = {results['spark_to_cli_ratio']:.2f}x")
    print(f"two-stage pipeline, {args.pipeline_records:,} records end to end: "
          f"{results['pipeline_records_per_s']:,.0f} records/s ({results['pipeline_s']:.1f} s)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "spark-latest.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
