"""The raftbroker commands against a real 3-node cluster (one cluster shared by the module)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.cli.main import app
from broker.client import Client
from broker.devcluster import DevCluster
from tests.cli.helpers import cli, json_lines, runner

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
REPO = Path(__file__).resolve().parents[2]


def test_topic_commands(bootstrap: str) -> None:
    created = json.loads(cli(bootstrap, "--json", "topic", "create", "cli-t", "--partitions", "3",
                             "--max-records", "100").stdout)
    assert created["name"] == "cli-t" and created["partition_count"] == 3
    assert created["retention"]["max_records"] == 100
    assert "cli-t" in cli(bootstrap, "topic", "list").stdout
    listed = json.loads(cli(bootstrap, "--json", "topic", "list").stdout)
    assert "cli-t" in [t["name"] for t in listed]
    human = cli(bootstrap, "topic", "describe", "cli-t").stdout
    assert "3 partition(s)" in human and "end offset" in human
    described = json.loads(cli(bootstrap, "--json", "topic", "describe", "cli-t").stdout)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert set(described["partitions"][0]) == {"partition", "start_offset", "end_offset", "records", "bytes"}
    dup = cli(bootstrap, "topic", "create", "cli-t", expect=1)
    assert dup.stderr.startswith("raftbroker: error: ") and "already exists" in dup.stderr
    assert json.loads(cli(bootstrap, "--json", "topic", "drop", "cli-t").stdout) == {"dropped": "cli-t"}
    missing = cli(bootstrap, "topic", "describe", "cli-t", expect=1)
    assert "does not exist" in missing.stderr and missing.stderr.count("\n") == 1


def test_publish_from_args_and_stdin_then_consume_json(bootstrap: str) -> None:
    cli(bootstrap, "topic", "create", "cli-pc", "--partitions", "2")
    from_args = json_lines(cli(bootstrap, "--json", "publish", "cli-pc", "one", "two", "--partition", "1",
                               "--key", "k", "--header", "src=test", "--header", "n=1"))
    assert from_args == [{"partition": 1, "offset": 0, "duplicate": False},
                         {"partition": 1, "offset": 1, "duplicate": False}]
    lines = "".join(f"line{i}\n" for i in range(1200))
    from_stdin = json_lines(cli(bootstrap, "--json", "publish", "cli-pc", "--partition", "0", input=lines))
    assert [r["offset"] for r in from_stdin] == list(range(1200))
    human = cli(bootstrap, "publish", "cli-pc", "--partition", "0", input="x\n").stdout
    assert human.strip() == "partition=0 offset=1200"

    records = json_lines(cli(bootstrap, "--json", "consume", "cli-pc", "--partition", "1"))
    assert [(r["offset"], r["value"], r["key"]) for r in records] == [(0, "one", "k"), (1, "two", "k")]
    assert records[0]["headers"] == {"src": "test", "n": "1"}
    assert {"topic", "partition", "offset", "key", "value", "headers", "timestamp_ms", "position"} <= set(records[0])
    everything = json_lines(cli(bootstrap, "--json", "consume", "cli-pc"))
    assert len(everything) == 1203
    limited = json_lines(cli(bootstrap, "--json", "consume", "cli-pc", "--partition", "0", "--from", "1198",
                             "--limit", "2"))
    assert [(r["offset"], r["value"]) for r in limited] == [(1198, "line1198"), (1199, "line1199")]
    token = records[0]["position"]
    resumed = json_lines(cli(bootstrap, "--json", "consume", "cli-pc", "--partition", "1", "--from",
                             f"token:{token}"))
    assert [r["value"] for r in resumed] == ["two"]
    human_lines = cli(bootstrap, "consume", "cli-pc", "--partition", "1").stdout.splitlines()
    assert human_lines == ["1:0 key=k one", "1:1 key=k two"]


def test_consume_binary_values_as_base64(bootstrap: str) -> None:
    with Client(bootstrap) as client:
        client.create_topic("cli-bin", 1)
        client.publish("cli-bin", b"\xff\xfe", key=b"\x80")
    (record,) = json_lines(cli(bootstrap, "--json", "consume", "cli-bin"))
    assert record["value"] is None and base64.b64decode(record["value_b64"]) == b"\xff\xfe"
    assert record["key"] is None and base64.b64decode(record["key_b64"]) == b"\x80"


def test_cluster_status(bootstrap: str, cluster: DevCluster) -> None:
    status = json.loads(cli(bootstrap, "--json", "cluster", "status").stdout)
    assert {n["address"] for n in status["nodes"]} == set(cluster.addresses)
    assert [n["role"] for n in status["nodes"]].count("leader") == 1
    leader = next(n for n in status["nodes"] if n["role"] == "leader")
    assert status["leader_id"] == leader["id"]
    assert set(leader) == {"id", "address", "role", "term", "commit_index", "applied_index", "pid",
                           "reachable", "leader_id", "apply_format", "cluster_format"}
    assert all(n["reachable"] and n["pid"] > 0 for n in status["nodes"])
    human = cli(bootstrap, "cluster", "status").stdout
    assert "leader" in human and "applied" in human


def test_bench_publish_with_tiny_counts(bootstrap: str) -> None:
    report = json.loads(cli(bootstrap, "--json", "bench", "publish", "--count", "20", "--batch-sizes", "1,10",
                            "--threads", "2").stdout)
    assert [(r["mode"], r["batch_size"]) for r in report["results"]] == [
        ("sequential", 1), ("concurrent", 1), ("sequential", 10), ("concurrent", 10)]
    assert all(r["records"] == 20 and r["msgs_per_s"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0
               for r in report["results"])
    table = cli(bootstrap, "bench", "publish", "--count", "10", "--batch-sizes", "5").stdout
    assert "msgs/s" in table and "concurrent" in table
    for durability in ("fsync", "memory", "ephemeral"):  # the SDK's idempotency keys suit every class
        classed = json.loads(cli(bootstrap, "--json", "bench", "publish", "--count", "10", "--batch-sizes", "5",
                                 "--durability", durability).stdout)
        assert classed["config"]["durability"] == durability
        assert all(r["records"] == 10 for r in classed["results"])
    topics = json.loads(cli(bootstrap, "--json", "topic", "list").stdout)
    assert not [t for t in topics if t["name"].startswith("bench-")], "the temporary topic is dropped"


def test_module_entry_point_and_bootstrap_env(bootstrap: str) -> None:
    env = dict(os.environ, RAFTBROKER_BOOTSTRAP=bootstrap, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-m", "broker.cli.main", "--json", "topic", "list"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert isinstance(json.loads(out.stdout), list)


def test_json_after_the_command(bootstrap: str) -> None:
    runner_args = ["topic", "create", "cli-after", "--json", "--bootstrap", bootstrap]
    created = runner.invoke(app, runner_args)  # no global option at all
    assert created.exit_code == 0, created.output
    assert json.loads(created.stdout)["name"] == "cli-after"
    published = json_lines(cli(bootstrap, "publish", "cli-after", "x", "--json"))
    assert published == [{"partition": 0, "offset": 0, "duplicate": False}]
    (record,) = json_lines(cli(bootstrap, "consume", "cli-after", "--json"))
    assert record["value"] == "x" and record["msg_id"] == ""
    status = json.loads(cli(bootstrap, "cluster", "status", "--json").stdout)
    assert status["leader_id"] and len(status["nodes"]) == 3
    assert [t["name"] for t in json.loads(cli(bootstrap, "topic", "list", "--json").stdout)].count("cli-after") == 1


def test_idempotency_key_and_producer_session(bootstrap: str) -> None:
    created = json.loads(cli(bootstrap, "topic", "create", "cli-dedup", "--dedup-window-ms", "-1", "--json").stdout)
    assert created["dedup_window_ms"] == -1
    assert "dedup window forever" in cli(bootstrap, "topic", "describe", "cli-dedup").stdout
    first = cli(bootstrap, "publish", "cli-dedup", "once", "--idempotency-key", "k1").stdout
    assert first == "partition=0 offset=0\n"
    assert cli(bootstrap, "publish", "cli-dedup", "once", "--idempotency-key", "k1").stdout == (
        "partition=0 offset=0 duplicate\n")
    assert json_lines(cli(bootstrap, "publish", "cli-dedup", "once", "--idempotency-key", "k1", "--json")) == [
        {"partition": 0, "offset": 0, "duplicate": True}]

    lines = "".join(f"s{i}\n" for i in range(5))
    session = json_lines(cli(bootstrap, "publish", "cli-dedup", "--dedup-id", "feed", "--msg-id", "1",
                             "--batch-size", "2", "--json", input=lines))
    assert [(r["offset"], r["duplicate"]) for r in session] == [(i, False) for i in range(1, 6)]
    resent = cli(bootstrap, "publish", "cli-dedup", "s3", "s4", "s5", "--dedup-id", "feed", "--msg-id", "4")
    no_place = "duplicate (at or below the producer session's watermark: nothing stored; no place is kept)"
    assert resent.stdout.splitlines() == [no_place, no_place, "partition=0 offset=6"]  # 0:0 is another record
    (last,) = [r for r in json_lines(cli(bootstrap, "consume", "cli-dedup", "--json")) if r["value"] == "s5"]
    assert last["msg_id"] == "6"

    assert json.loads(cli(bootstrap, "dedup", "watermarks", "cli-dedup", "--json").stdout) == [
        {"dedup_id": "feed", "msg_id": 6}]
    table = cli(bootstrap, "dedup", "watermarks", "cli-dedup").stdout
    assert "dedup id" in table and "feed" in table and "6" in table
    assert json.loads(cli(bootstrap, "dedup", "reset", "cli-dedup", "feed", "--json").stdout) == {
        "topic": "cli-dedup", "dedup_id": "feed", "reset": True}
    assert cli(bootstrap, "dedup", "watermarks", "cli-dedup").stdout.strip() == "no watermarks on cli-dedup"
    assert cli(bootstrap, "--json", "dedup", "watermarks", "cli-dedup").stdout.strip() == "[]"
    again = cli(bootstrap, "dedup", "reset", "cli-dedup", "feed")
    assert again.stdout.strip() == "cli-dedup has no watermark of feed: nothing to reset"
    assert json.loads(cli(bootstrap, "dedup", "reset", "cli-dedup", "feed", "--json").stdout)["reset"] is False
    missing = cli(bootstrap, "dedup", "watermarks", "nope", expect=1)
    assert missing.stderr.startswith("raftbroker: error: ") and "does not exist" in missing.stderr
    gap = cli(bootstrap, "publish", "cli-dedup", "g", "--dedup-id", "feed", "--msg-id", "3", expect=1)
    assert "breaks the sequence" in gap.stderr, "after the reset the session must start at 1"
