"""An operator's walk of the data plane's less-travelled features against a real 3-node cluster:
an ephemeral topic refuses retention it could never apply (and nothing is created or changed),
``prune --group G --before 0`` deletes nothing instead of everything G committed, and
``consume --json`` shows each record's op and origin (what a mirrored topic is checked by)."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import cli, json_lines

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def test_an_ephemeral_topic_refuses_retention_and_nothing_changes(bootstrap: str) -> None:
    refused = cli(bootstrap, "topic", "create", "walk-eph", "--durability", "ephemeral", "--max-records", "1",
                  expect=1)
    assert "retention max_records would never apply" in refused.stderr
    assert "walk-eph" not in [t["name"] for t in json.loads(cli(bootstrap, "topic", "list", "--json").stdout)]
    cli(bootstrap, "topic", "create", "walk-eph", "--durability", "ephemeral")
    refused = cli(bootstrap, "topic", "alter", "walk-eph", "--full-policy", "reject", expect=1)
    assert "full_policy reject would never apply" in refused.stderr
    described = json.loads(cli(bootstrap, "topic", "describe", "walk-eph", "--json").stdout)
    assert described["full_policy"] == "discard_old" and described["retention"]["max_records"] is None


def test_prune_by_group_before_0_deletes_nothing(bootstrap: str) -> None:
    cli(bootstrap, "topic", "create", "walk-prune")
    cli(bootstrap, "publish", "walk-prune", *[str(i) for i in range(10)])
    cli(bootstrap, "group", "create", "walk-prune", "arch")
    cli(bootstrap, "group", "mark", "walk-prune", "arch", "--lead")
    cli(bootstrap, "consume", "walk-prune", "--group", "arch", "--limit", "6")
    refused = cli(bootstrap, "prune", "walk-prune", "--group", "arch", "--before", "0", expect=2)
    assert "--before" in refused.output and "would delete nothing" in refused.output
    (partition,) = json.loads(cli(bootstrap, "topic", "describe", "walk-prune", "--json").stdout)["partitions"]
    assert (partition["start_offset"], partition["records"]) == (0, 10)
    pruned = json.loads(cli(bootstrap, "prune", "walk-prune", "--group", "arch", "--before", "4", "--json").stdout)
    assert pruned == {"topic": "walk-prune", "pruned": 4}


def test_consume_json_shows_op_and_origin(bootstrap: str) -> None:
    cli(bootstrap, "topic", "create", "walk-origin")
    cli(bootstrap, "publish", "walk-origin", "v")
    (record,) = json_lines(cli(bootstrap, "consume", "walk-origin", "--json"))
    assert record["op"] == "insert" and record["origin"].startswith("local/n") and record["producer"] == ""
