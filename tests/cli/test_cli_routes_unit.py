"""Parsing of the route and retention commands, without a cluster."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from broker.cli.log_admin import merged_retention
from broker.cli.main import app
from broker.cli.route import parse_ops
from broker.client import Retention

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_ops_parse_and_refuse_unknown_ones() -> None:
    assert parse_ops("insert, UPDATE,delete") == ["insert", "update", "delete"]
    assert parse_ops(None) is None
    for bad in ("upsert", ",", "insert,nope"):
        with pytest.raises(typer.BadParameter):
            parse_ops(bad)


def test_alter_keeps_caps_not_given_and_zero_removes_one() -> None:
    current = Retention(max_age_ms=10, max_records=20, max_bytes=None)
    assert merged_retention(current, None, None, None) == current
    assert merged_retention(current, 0, 5, 7) == Retention(max_age_ms=None, max_records=5, max_bytes=7)


def test_usage_errors_exit_2_before_connecting() -> None:
    runner = CliRunner()
    for args in (["topic", "alter", "t"], ["prune", "t"], ["route", "create", "r", "--from", "a"],
                 ["route", "create", "r", "--from", "a", "--to", "b", "--to-cluster", "nohost"]):
        result = runner.invoke(app, ["--bootstrap", "127.0.0.1:1", *args])
        assert result.exit_code == 2, (args, result.output)
