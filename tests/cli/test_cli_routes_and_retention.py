"""``topic create --schema/--dedup-fields``, ``topic alter|clear``, ``prune``, ``consume --filter`` and
``route create|list|delete`` against a real 3-node cluster (one cluster shared by the module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from broker.client import Client
from broker.leader.partitioning import partition_for_key
from tests.cli.helpers import cli, json_lines
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_create_with_schema_and_dedup_fields(bootstrap: str, tmp_path: Path) -> None:
    schema = tmp_path / "page.json"
    schema.write_text(json.dumps({"type": "object", "required": ["url"], "properties": {"url": {"type": "string"}}}))
    created = json.loads(cli(bootstrap, "topic", "create", "cli-pages", "--schema", str(schema), "--dedup-fields",
                             "url", "--max-records", "50", "--full-policy", "reject", "--json").stdout)
    assert json.loads(created["schema_json"])["required"] == ["url"] and created["dedup_fields"] == ["url"]
    assert created["retention"]["max_records"] == 50 and created["full_policy"] == "reject"
    assert "dedup fields: url" in cli(bootstrap, "topic", "describe", "cli-pages").stdout
    cli(bootstrap, "publish", "cli-pages", '{"url": "a"}', '{"url": "b"}')
    dup = cli(bootstrap, "publish", "cli-pages", '{"url": "a"}', expect=1)
    assert "already exists" in dup.stderr and dup.stderr.count("\n") == 1
    bad = cli(bootstrap, "publish", "cli-pages", '{"url": 7}', expect=1)
    assert "record 0: field url" in bad.stderr
    not_json = tmp_path / "bad.json"
    not_json.write_text("[1, 2")
    assert "is not JSON" in cli(bootstrap, "topic", "create", "x", "--schema", str(not_json), expect=2).output

    filtered = json_lines(cli(bootstrap, "consume", "cli-pages", "--filter", 'value.url == "b"', "--json"))
    assert [r["value"] for r in filtered] == ['{"url": "b"}']
    invalid = cli(bootstrap, "consume", "cli-pages", "--filter", "value.url ==", expect=1)
    assert "invalid filter expression" in invalid.stderr


def test_alter_clear_and_prune(bootstrap: str) -> None:
    cli(bootstrap, "topic", "create", "cli-log", "--partitions", "2", "--max-age-ms", "3600000")
    cli(bootstrap, "publish", "cli-log", "--partition", "0", input="".join(f"{i}\n" for i in range(10)))
    cli(bootstrap, "publish", "cli-log", "--partition", "1", input="".join(f"{i}\n" for i in range(10)))
    altered = json.loads(cli(bootstrap, "topic", "alter", "cli-log", "--max-records", "100", "--max-bytes", "9000",
                             "--full-policy", "reject", "--json").stdout)
    assert altered["retention"] == {"max_age_ms": 3600000, "max_records": 100, "max_bytes": 9000}
    assert altered["full_policy"] == "reject"
    removed = json.loads(cli(bootstrap, "topic", "alter", "cli-log", "--max-age-ms", "0", "--json").stdout)
    assert removed["retention"] == {"max_age_ms": None, "max_records": 100, "max_bytes": 9000}
    assert "full policy reject" in cli(bootstrap, "topic", "alter", "cli-log", "--max-bytes", "0").stdout
    assert cli(bootstrap, "topic", "alter", "cli-log", expect=2).exit_code == 2

    assert cli(bootstrap, "prune", "cli-log", "--before", "4", "--partition", "1").stdout.strip() == (
        "pruned 4 record(s) from cli-log")
    assert json.loads(cli(bootstrap, "prune", "cli-log", "--before", "6", "--json").stdout) == {
        "topic": "cli-log", "pruned": 8}
    first = json_lines(cli(bootstrap, "consume", "cli-log", "--partition", "1", "--from", "0", "--json"))
    assert first[0]["event"] == "skip_forward" and first[1]["offset"] == 6
    assert "does not exist" in cli(bootstrap, "prune", "cli-log", "--group", "archiver", expect=1).stderr
    assert cli(bootstrap, "prune", "cli-log", expect=2).exit_code == 2

    cli(bootstrap, "group", "create", "cli-log", "archiver")
    cli(bootstrap, "group", "create", "cli-log", "audit")
    cli(bootstrap, "group", "seek", "cli-log", "archiver", "--to", "8")
    cli(bootstrap, "group", "seek", "cli-log", "audit", "--to", "7")
    assert "not marked lead" in cli(bootstrap, "prune", "cli-log", "--group", "archiver", expect=1).stderr
    assert "prune role lead" in cli(bootstrap, "group", "mark", "cli-log", "archiver", "--lead").stdout
    marked = json.loads(cli(bootstrap, "group", "mark", "cli-log", "audit", "--protect", "--json").stdout)
    assert marked["prune_role"] == "protect"
    refused = cli(bootstrap, "prune", "cli-log", "--group", "archiver", expect=1)
    assert "group 'audit' protects partition 0 from offset 7" in refused.stderr
    assert "clear of topic 'cli-log' refused" in cli(bootstrap, "topic", "clear", "cli-log", expect=1).stderr
    assert "prune role" in cli(bootstrap, "group", "list", "cli-log").stdout
    assert cli(bootstrap, "group", "mark", "cli-log", "audit", "--lead", "--none", expect=2).exit_code == 2
    cli(bootstrap, "group", "mark", "cli-log", "audit", "--none")
    assert json.loads(cli(bootstrap, "prune", "cli-log", "--group", "archiver", "--json").stdout) == {
        "topic": "cli-log", "pruned": 4}

    assert json.loads(cli(bootstrap, "topic", "clear", "cli-log", "--json").stdout) == {"cleared": "cli-log"}
    described = json.loads(cli(bootstrap, "topic", "describe", "cli-log", "--json").stdout)
    assert described["records"] == 0 and [p["end_offset"] for p in described["partitions"]] == [10, 10]
    assert "cleared topic cli-log" in cli(bootstrap, "topic", "clear", "cli-log").stdout
    assert "does not exist" in cli(bootstrap, "topic", "clear", "nope", expect=1).stderr


def test_route_commands_filter_partition_key_and_cycle(bootstrap: str) -> None:
    cli(bootstrap, "topic", "create", "cli-orders", "--partitions", "2")
    cli(bootstrap, "topic", "create", "cli-paid", "--partitions", "3")
    created = json.loads(cli(bootstrap, "route", "create", "paid", "--from", "cli-orders", "--to", "cli-paid",
                             "--filter", 'value.status == "paid"', "--partition-key", "value.customer",
                             "--op", "insert,update", "--json").stdout)
    assert created["ops"] == ["insert", "update"] and created["filter"] == 'value.status == "paid"'
    lines = "".join(json.dumps({"n": i, "status": "paid" if i % 2 else "open", "customer": f"c{i % 4}"}) + "\n"
                    for i in range(40))
    cli(bootstrap, "publish", "cli-orders", "--partition", "1", input=lines)

    def routed() -> list[dict[str, Any]]:
        records = json_lines(cli(bootstrap, "consume", "cli-paid", "--json"))
        return records if len(records) == 20 else []

    copies = wait_until(routed, 30, "the route to copy the paid orders")
    assert isinstance(copies, list)
    with Client(bootstrap) as client:
        origin = next(r for r in client.subscribe("cli-orders", stop_at_end=True)).origin  # type: ignore[union-attr]
    for record in copies:
        doc = json.loads(record["value"])
        assert doc["status"] == "paid"
        assert record["partition"] == partition_for_key(doc["customer"].encode(), 3)
    for target in range(3):  # FIFO per source partition
        ns = [json.loads(r["value"])["n"] for r in copies if r["partition"] == target]
        assert ns == sorted(ns)
    with Client(bootstrap) as client:
        assert {r.origin for r in client.subscribe("cli-paid", stop_at_end=True)} == {origin}  # type: ignore[union-attr]

    listed = json.loads(cli(bootstrap, "route", "list", "--json").stdout)
    (paid,) = [r for r in listed if r["name"] == "paid"]
    assert paid["lag"] == 0 and paid["copied"] == 20 and paid["skipped"] == 20
    assert [(p["partition"], p["next_offset"]) for p in paid["partitions"]] == [(0, 0), (1, 40)]
    assert "paid" in cli(bootstrap, "route", "list").stdout

    cycle = cli(bootstrap, "route", "create", "back", "--from", "cli-paid", "--to", "cli-orders", expect=1)
    assert "cycle" in cycle.stderr and "cli-paid -> cli-orders -> cli-paid" in cycle.stderr
    assert "already exists" in cli(bootstrap, "route", "create", "paid", "--from", "cli-orders", "--to", "cli-paid",
                                   expect=1).stderr
    assert cli(bootstrap, "route", "create", "x", "--from", "cli-orders", "--to", "cli-paid", "--op", "upsert",
               expect=2).exit_code == 2
    assert json.loads(cli(bootstrap, "route", "delete", "paid", "--json").stdout) == {"deleted": "paid"}
    assert "does not exist" in cli(bootstrap, "route", "delete", "paid", expect=1).stderr
    cli(bootstrap, "route", "create", "back", "--from", "cli-paid", "--to", "cli-orders")  # no cycle any more
    assert "no routes" not in cli(bootstrap, "route", "list").stdout
