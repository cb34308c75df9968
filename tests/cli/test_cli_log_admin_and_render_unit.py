"""`raftbroker prune --group G --before 0` and the record JSON of `consume --json`, without a server:
a refused prune never connects (exit 2 against an address where nothing listens), and a record's
JSON carries its op, origin and producer (what an operator checks on a mirrored topic)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from broker.cli import render
from broker.cli.main import app
from broker.client import Record
from broker.devcluster import free_base_port

pytestmark = pytest.mark.unit

runner = CliRunner()


def test_prune_by_group_before_offset_0_is_a_usage_error_not_an_unbounded_prune() -> None:
    """On the wire, before_offset 0 with a group means "no bound": the CLI's 'no further than 0'
    must not become 'everything the group committed'."""
    dead = f"127.0.0.1:{free_base_port(1)}"
    result = runner.invoke(app, ["--bootstrap", dead, "prune", "t", "--group", "archiver", "--before", "0"])
    assert result.exit_code == 2, result.output
    assert "--before" in result.output and "would delete nothing" in result.output


def test_record_json_shows_op_origin_and_producer() -> None:
    rec = Record(topic="t", partition=0, offset=5, key=None, value=b"v", headers={}, timestamp_ms=1, position=b"\x01",
                 producer="svc-a", op="update", origin="west/n2")
    out = render.record_json(rec)
    assert (out["op"], out["origin"], out["producer"]) == ("update", "west/n2", "svc-a")
