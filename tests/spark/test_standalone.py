"""The same jobs beyond one process (issue 16 item 6): a real Spark standalone master and one
worker started from the installed pyspark (loopback only), a pipeline and the archive run
against them, and the stage function provably ran in the worker's executor, not in this process."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from broker.client import Client, OutgoingRecord, Record
from broker.pipeline import topic
from broker.spark import session
from broker.spark.archive import run_archive
from tests.conftest import wait_until
from tests.spark.conftest import records_only, spark_env

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tagged(record: Record) -> OutgoingRecord:
    """Runs on an executor: marks each record with the executor's working directory and pid."""
    return OutgoingRecord(value=record.value.upper(), headers={"cwd": os.getcwd(), "pid": str(os.getpid())})


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A master and a worker (1 core, 1 GiB) as separate JVMs; both killed at teardown."""
    base = tmp_path_factory.mktemp("standalone")
    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    port, worker_dir = free_port(), base / "work"
    env = spark_env(SPARK_WORKER_DIR=str(worker_dir), SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                    SPARK_LOG_DIR=str(base))
    logs = [open(base / name, "wb") for name in ("master.log", "worker.log")]  # noqa: SIM115
    procs = [subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(free_port())], env=env,
                              stdout=logs[0], stderr=subprocess.STDOUT, start_new_session=True)]
    try:
        wait_until(lambda: b"I have been elected leader" in (base / "master.log").read_bytes(), 300, "the master")
        procs.append(subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                                       "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port",
                                       str(free_port()), "--work-dir", str(worker_dir)], env=env,
                                      stdout=logs[1], stderr=subprocess.STDOUT, start_new_session=True))
        wait_until(lambda: b"Successfully registered with master" in (base / "worker.log").read_bytes(), 300,
                   "the worker to register")
        yield {"master": f"spark://127.0.0.1:{port}", "worker_dir": worker_dir, "pids": [p.pid for p in procs]}
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
            proc.wait(30)
        for log in logs:
            log.close()


def test_pipeline_and_archive_on_a_standalone_cluster(standalone: dict[str, Any], bootstrap: str,
                                                      tmp_path: Path) -> None:
    spark = session(standalone["master"], app_name="raftbroker-standalone",
                    **{"spark.executorEnv.PYTHONPATH": str(REPO), "spark.cores.max": "1",
                       "spark.executor.memory": "512m"})
    try:
        with Client(bootstrap) as client:
            client.create_topic("sa-src", 2)
            client.create_topic("sa-dst", 2)
            client.publish_batch("sa-src", [{"value": f"v{i}", "partition": i % 2} for i in range(30)])
        topic("sa-src").pipe(tagged).to(topic("sa-dst")).run(bootstrap=bootstrap, spark=spark,
                                                               checkpoint=tmp_path / "ck")
        with Client(bootstrap) as client:
            out = records_only(client.subscribe("sa-dst", stop_at_end=True))
        assert sorted(r.value.decode() for r in out) == sorted(f"V{i}" for i in range(30))
        for p in range(2):
            assert [r.value.decode() for r in out if r.partition == p] == [f"V{i}" for i in range(p, 30, 2)]
        assert all(r.headers["cwd"].startswith(str(standalone["worker_dir"])) for r in out)  # in the executor
        assert all(int(r.headers["pid"]) != os.getpid() for r in out)
        result = run_archive(spark, bootstrap, "sa-src", tmp_path / "archive")
        assert result.records_written == 30 and result.pruned == 30
        rows = spark.read.parquet(str(tmp_path / "archive")).collect()
        assert sorted((r.partition, r.offset) for r in rows) == sorted((i % 2, i // 2) for i in range(30))
    finally:
        spark.stop()
