"""``raftbroker consume --group`` and ``raftbroker group ...`` against a real 3-node cluster."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from typer.testing import Result

from broker.client import Client
from broker.devcluster import DevCluster
from tests.cli.helpers import cli

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_consume_with_a_group_acks_what_it_prints_and_lag_counts_the_rest(bootstrap: str) -> None:
    cli(bootstrap, "topic", "create", "cg", "--partitions", "2")
    cli(bootstrap, "publish", "cg", *[f"v{i}" for i in range(10)])
    first = lines(cli(bootstrap, "consume", "cg", "--group", "billing", "--limit", "4", "--json"))
    assert len(first) == 4 and all(r["delivery_attempt"] == 1 for r in first)
    lag = json.loads(cli(bootstrap, "group", "lag", "cg", "billing", "--json").stdout)
    assert lag["lag"] == 6 and sum(p["in_flight"] for p in lag["partitions"]) == 0
    assert {p["partition"]: p["end_offset"] for p in lag["partitions"]} == {0: 5, 1: 5}
    rest = lines(cli(bootstrap, "consume", "cg", "--group", "billing", "--json"))
    assert sorted(r["value"] for r in first + rest) == sorted(f"v{i}" for i in range(10))
    assert json.loads(cli(bootstrap, "group", "lag", "cg", "billing", "--json").stdout)["lag"] == 0
    human = cli(bootstrap, "group", "lag", "cg", "billing").stdout
    assert "committed" in human and "total lag 0" in human
    other = lines(cli(bootstrap, "consume", "cg", "--group", "stream-readers", "--mode", "stream", "--json"))
    assert len(other) == 10, "a second group gets everything again"
    listed = json.loads(cli(bootstrap, "group", "list", "cg", "--json").stdout)
    assert [(g["group"], g["mode"]) for g in listed] == [("billing", "queue"), ("stream-readers", "stream")]
    missing = cli(bootstrap, "group", "list", "no-such-topic", expect=1)
    assert "does not exist" in missing.stderr, "an unknown topic is not a topic without groups"


def test_seek_replay_pause_resume_and_delete(bootstrap: str) -> None:
    cli(bootstrap, "topic", "create", "cg-ops")
    cli(bootstrap, "publish", "cg-ops", "a", "b", "c")
    assert len(lines(cli(bootstrap, "consume", "cg-ops", "--group", "g", "--json"))) == 3
    assert json.loads(cli(bootstrap, "group", "seek", "cg-ops", "g", "--to", "offset:1", "--json").stdout) == {"0": 1}
    assert [r["value"] for r in lines(cli(bootstrap, "consume", "cg-ops", "--group", "g", "--json"))] == ["b", "c"]
    cli(bootstrap, "group", "replay", "cg-ops", "g", "--from", "ts:0")
    assert json.loads(cli(bootstrap, "group", "replay", "cg-ops", "g", "--from", "0", "--json").stdout) == {"0": 0}, \
        "a bare number is ms, as the help says (it was refused as an offset)"
    assert json.loads(cli(bootstrap, "group", "pause", "cg-ops", "--json").stdout)["paused"] == ["g"]
    paused = lines(cli(bootstrap, "consume", "cg-ops", "--group", "g", "--json"))
    assert [e["event"] for e in paused] == ["paused"], "a paused group gets nothing, and says why"
    cli(bootstrap, "group", "resume", "cg-ops", "g")
    assert len(lines(cli(bootstrap, "consume", "cg-ops", "--group", "g", "--json"))) == 3
    described = json.loads(cli(bootstrap, "group", "describe", "cg-ops", "g", "--json").stdout)
    assert described["dlq_topic"] == "cg-ops.g.dlq" and described["visibility_timeout_ms"] == 30000
    cli(bootstrap, "group", "delete", "cg-ops", "g")
    missing = cli(bootstrap, "group", "lag", "cg-ops", "g", expect=1)
    assert "does not exist" in missing.stderr


def test_dead_letter_commands(bootstrap: str, cluster: DevCluster) -> None:
    cli(bootstrap, "topic", "create", "cg-dl")
    cli(bootstrap, "publish", "cg-dl", "poison", "ok")
    cli(bootstrap, "group", "create", "cg-dl", "strict", "--max-attempts", "1", "--base-delay-ms", "10")
    with Client(cluster.addresses) as client:
        consumer = client.subscribe("cg-dl", group="strict", stop_at_end=True)
        for message in consumer:
            if message.value == b"poison":  # type: ignore[union-attr]
                message.nack()  # type: ignore[union-attr]
            else:
                message.ack()  # type: ignore[union-attr]
        consumer.close()
    dead = json.loads(cli(bootstrap, "group", "dlq", "list", "cg-dl", "strict", "--json").stdout)
    assert [(d["offset"], d["attempts"], d["record"]["value"]) for d in dead] == [(0, 1, "poison")]
    assert dead[0]["record"]["headers"]["dlq.topic"] == "cg-dl"
    assert "poison" in cli(bootstrap, "group", "dlq", "list", "cg-dl", "strict").stdout
    assert json.loads(cli(bootstrap, "group", "dlq", "retry-all", "cg-dl", "strict", "--json").stdout) == {"retried": 1,
                                                                                                  "pruned": 0}
    again = lines(cli(bootstrap, "consume", "cg-dl", "--group", "strict", "--json"))
    assert [r["value"] for r in again] == ["poison"], "retried, and consume acked it"
    assert json.loads(cli(bootstrap, "group", "dlq", "purge", "cg-dl", "strict", "--json").stdout) == {"purged": 0}
    cli(bootstrap, "group", "dlq", "retry", "cg-dl", "strict", "0:9")  # no such dead letter: ignored
    beyond = cli(bootstrap, "group", "dlq", "retry", "cg-dl", "strict", "7:0", expect=1)
    assert "partition 7 does not exist (topic has 1)" in beyond.stderr


def test_consume_json_events_carry_both_positions(bootstrap: str) -> None:
    cli(bootstrap, "topic", "create", "cg-reset")
    cli(bootstrap, "publish", "cg-reset", "old")
    cli(bootstrap, "consume", "cg-reset", "--group", "r")
    cli(bootstrap, "topic", "drop", "cg-reset")
    cli(bootstrap, "topic", "create", "cg-reset")
    cli(bootstrap, "publish", "cg-reset", "new")
    out = lines(cli(bootstrap, "consume", "cg-reset", "--group", "r", "--json"))
    event, record = out
    assert event["event"] == "reset" and (event["offset_before"], event["offset_after"]) == (1, 0)
    assert base64.b64decode(event["position_before"]) != base64.b64decode(event["position_after"])
    assert record["value"] == "new"
    stateless = lines(cli(bootstrap, "consume", "cg-reset", "--from", "token:" + event["position_before"], "--json"))
    assert stateless[0]["event"] == "reset" and "position_after" in stateless[0], "the same shape without a group"
