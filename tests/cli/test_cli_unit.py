"""CLI parsing, output shapes and error reporting that need no cluster."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner

from broker.cli import render
from broker.cli.data import parse_from, parse_headers, stdin_batches
from broker.cli.main import app
from broker.client import Record
from broker.devcluster import free_base_port
from tests.client.fakes import FakeNode

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
runner = CliRunner()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("earliest", ("earliest", None)),
        ("latest", ("latest", None)),
        ("42", (42, None)),
        ("999999999999", (999_999_999_999, None)),
        ("1700000000000", ("earliest", 1_700_000_000_000)),
        ("offset:1700000000000", (1_700_000_000_000, None)),
        ("ts:5", ("earliest", 5)),
        ("ts:1970-01-01T00:00:01Z", ("earliest", 1000)),
        ("token:" + base64.b64encode(b"\x01abc").decode(), (b"\x01abc", None)),
        # the HTTP API's position and receipt: unpadded base64url
        ("token:" + base64.urlsafe_b64encode(b"\xfb\xff\x01").decode(), (b"\xfb\xff\x01", None)),
        ("token:" + base64.urlsafe_b64encode(b"\x01abcd").decode().rstrip("="), (b"\x01abcd", None)),
    ],
)
def test_from_distinguishes_offsets_timestamps_and_tokens(text: str, expected: object) -> None:
    assert parse_from(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "soon", "offset:x", "ts:yesterday", "ts:2024-01-01T00:00:00", "token:%%",
                                  "token:a", "token:ab+_"])
def test_bad_from_is_a_usage_error(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_from(text)


def test_a_bad_start_names_its_option_and_a_missing_time_zone_says_so() -> None:
    with pytest.raises(typer.BadParameter) as raised:
        parse_from("ts:2020-01-01", "--to")
    assert raised.value.param_hint == "--to"
    assert "needs a time zone, e.g. 2020-01-01T00:00:00Z" in raised.value.message
    assert "(default)" not in raised.value.message, "--to has no default"


def test_headers_parse_and_reject_items_without_equals() -> None:
    assert parse_headers(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(typer.BadParameter):
        parse_headers(["novalue"])


def test_stdin_batches_by_count_without_a_file_descriptor() -> None:
    lines = b"".join(b"%d\n" % i for i in range(7)) + b"last-without-newline"
    batches = list(stdin_batches(io.BytesIO(lines), 3))
    assert [len(b) for b in batches] == [3, 3, 2]
    assert batches[0] == [b"0", b"1", b"2"] and batches[-1][-1] == b"last-without-newline"


def test_stdin_batch_is_sent_when_no_more_input_is_waiting() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"a\nb\n")
    batches = stdin_batches(os.fdopen(read_fd, "rb"), 500)
    first: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: first.append(next(batches)), daemon=True)
    reader.start()
    reader.join(5)
    assert first == [[b"a", b"b"]], "a half-full batch goes out while the writer is still open"
    os.write(write_fd, b"c\n")
    os.close(write_fd)
    assert list(batches) == [[b"c"]]


def test_record_json_falls_back_to_base64_for_binary() -> None:
    rec = Record(topic="t", partition=1, offset=2, key=b"\xfe", value=b"\xff\x00", headers={"h": "v"},
                 timestamp_ms=3, position=b"\x01")
    out = render.record_json(rec)
    assert out["key"] is None and base64.b64decode(out["key_b64"]) == b"\xfe"
    assert out["value"] is None and base64.b64decode(out["value_b64"]) == b"\xff\x00"
    text = render.record_json(Record("t", 0, 0, None, "é".encode(), {}, 1, b""))
    assert text["value"] == "é" and text["key"] is None and "value_b64" not in text


def test_unreachable_cluster_is_one_line_on_stderr_and_exit_1() -> None:
    dead = f"127.0.0.1:{free_base_port(1)}"
    result = runner.invoke(app, ["--bootstrap", dead, "--retry-deadline", "0.3", "topic", "list"])
    assert result.exit_code == 1
    assert result.stderr.startswith("raftbroker: error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output and dead in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["consume", "t", "--from", "soon"],
        ["publish", "t", "x", "--header", "novalue"],
        ["--bootstrap", "nohostport", "topic", "list"],
        ["topic", "create"],
        ["topic", "create", "t", "--partitions", "0"],
        ["bench", "publish", "--batch-sizes", "0"],
        ["topic", "list", "--bootstrap", "nohostport"],
        ["topic", "create", "t", "--dedup-window-ms", "0"],
        ["topic", "create", "t", "--dedup-window-ms", "-2"],
        ["publish", "t", "a", "b", "--idempotency-key", "k"],
        ["publish", "t", "--idempotency-key", "k"],  # stdin is empty: no record
        ["publish", "t", "a", "--idempotency-key", ""],
        ["publish", "t", "a", "--idempotency-key", "k" * 257],
        ["publish", "t", "a", "--dedup-id", "d"],
        ["publish", "t", "a", "--msg-id", "1"],
        ["publish", "t", "a", "--dedup-id", "d", "--msg-id", "0"],
        ["publish", "t", "a", "--dedup-id", "", "--msg-id", "1"],
        ["dedup", "reset", "t"],
        ["consume", "t", "--mode", "stream"],  # a group's mode, without --group (it was ignored)
        ["group", "replay", "t", "g", "--from", "offset:5"],
        ["group", "create", "t", "g", "--session-timeout-ms", "5000"],  # queue mode (the default): it was unused
        ["group", "create", "t", "g", "--mode", "stream", "--ordered"],
        ["--timeout", "1e10", "topic", "list"],  # past gRPC's int64-nanosecond deadline: every call failed
        ["dev", "--cluster-id", "eu/west"],  # refused before any node starts (origins split at the "/")
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_usage_errors_name_the_option_that_was_wrong() -> None:
    route = runner.invoke(app, ["route", "create", "r", "--from", "a", "--to", "b", "--to-cluster", "garbage"])
    assert route.exit_code == 2 and "--to-cluster" in route.output and "--bootstrap" not in route.output
    timeout = runner.invoke(app, ["--timeout", "1e10", "topic", "list"])
    assert "--timeout" in timeout.output and "86400" in timeout.output


def test_serve_refuses_an_unknown_log_level_before_it_starts() -> None:
    """It was a traceback from logging. In a process of its own: ``serve`` may re-execute itself."""
    done = subprocess.run([sys.executable, "-m", "broker.cli.launch", "serve", "--log-level", "LOUD"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "--log-level" in done.stderr and "Traceback" not in done.stderr


def test_the_cli_and_the_sdk_bound_one_attempt_alike() -> None:
    from broker.cli.main import TIMEOUT_S_MAX
    from broker.client.routing import TIMEOUT_S_MAX as SDK_TIMEOUT_S_MAX

    assert TIMEOUT_S_MAX == SDK_TIMEOUT_S_MAX


def test_the_drill_help_names_every_scenario() -> None:
    from chaos.scenarios import ALL, SCENARIOS

    shown = " ".join(runner.invoke(app, ["drill", "--help"], terminal_width=400).output.split())
    assert all(name in shown for name in [*SCENARIOS, ALL]), shown


def test_an_idempotency_key_with_several_stdin_lines_is_a_usage_error() -> None:
    result = runner.invoke(app, ["publish", "t", "--idempotency-key", "k"], input="a\nb\n")
    assert result.exit_code == 2 and "exactly one record, got 2" in result.output


@pytest.fixture
def fake() -> Iterator[FakeNode]:
    node = FakeNode("n1")
    node.script.topics["t"] = 1
    yield node
    node.stop()


def test_json_and_bootstrap_are_accepted_after_the_command(fake: FakeNode) -> None:
    dead = f"127.0.0.1:{free_base_port(1)}"
    published = runner.invoke(app, ["publish", "t", "x", "--json", "--bootstrap", fake.address])
    assert published.exit_code == 0, published.output
    assert [json.loads(line) for line in published.stdout.splitlines()] == [
        {"partition": 0, "offset": 0, "duplicate": False}]
    described = runner.invoke(app, ["--bootstrap", dead, "topic", "describe", "t", "-b", fake.address, "--json"])
    assert described.exit_code == 0, described.output
    assert json.loads(described.stdout)["name"] == "t", "the --bootstrap after the command wins"
    consumed = runner.invoke(app, ["--json", "consume", "t", "-b", fake.address])
    assert consumed.exit_code == 0, consumed.output
    assert json.loads(consumed.stdout)["value"] == "x"
    human = runner.invoke(app, ["consume", "t", "-b", fake.address])
    assert human.stdout == "0:0 x\n", "without --json anywhere the output stays human"


@pytest.mark.parametrize(("args", "said"), [
    (["topic", "create", "z", "-p", "100000000000"], "partitions must be between 1 and 2**32 - 1"),
    (["topic", "create", "z", "--max-bytes", "99999999999999999999"], "retention max_bytes must be between"),
    (["group", "create", "t", "g", "--max-attempts", "99999999999"], "max_attempts must be between 1 and"),
    (["group", "seek", "t", "g", "--to", "offset:999999999999999999999"], "must be between 0 and 2**64 - 1"),
    (["group", "replay", "t", "g", "--from", "ts:99999999999999999999"], "timestamp_ms must be between"),
    (["group", "dlq", "retry", "t", "g", "0:99999999999999999999"], "a dead letter's offset must be between"),
    (["prune", "t", "--before", "99999999999999999999"], "before_offset must be between 0 and 2**64 - 1"),
    (["publish", "t", "a", "-p", "99999999999"], "partition must be between 0 and 2**32 - 1"),
    (["publish", "t", "a", "--dedup-id", "x", "--msg-id", "99999999999999999999"], "last msg_id"),
    (["consume", "t", "--from", "offset:99999999999999999999"], "must be between 0 and 2**64 - 1"),
])
def test_a_number_too_large_for_the_wire_is_refused_by_name(fake: FakeNode, args: list[str], said: str) -> None:
    """protobuf's own "Value out of range" named nothing and came out as an internal error."""
    result = runner.invoke(app, [*args, "-b", fake.address])
    assert result.exit_code == 1, result.output
    assert said in result.stderr and "internal error" not in result.stderr


def test_publish_prints_duplicates_of_an_idempotency_key(fake: FakeNode) -> None:
    args = ["publish", "t", "once", "--idempotency-key", "order-1", "-b", fake.address]
    assert runner.invoke(app, args).stdout == "partition=0 offset=0\n"
    assert runner.invoke(app, args).stdout == "partition=0 offset=0 duplicate\n"
    again = runner.invoke(app, [*args, "--json"])
    assert json.loads(again.stdout) == {"partition": 0, "offset": 0, "duplicate": True}
    from_stdin = runner.invoke(app, ["publish", "t", "--idempotency-key", "order-2", "-b", fake.address, "--json"],
                               input="single line\n")
    assert json.loads(from_stdin.stdout) == {"partition": 0, "offset": 1, "duplicate": False}
    assert fake.script.logs[("t", 0)] == [b"once", b"single line"]


def test_every_documented_command_is_wired_into_the_cli() -> None:
    from broker.cli.main import app as real_app

    for command in (["drill"], ["group", "mark"], ["route", "create"], ["prune"], ["topic", "alter"],
                    ["dedup", "watermarks"], ["cluster", "add-node"], ["bench", "failover"]):
        result = CliRunner().invoke(real_app, [*command, "--help"])
        assert result.exit_code == 0, f"raftbroker {' '.join(command)}: {result.output}"


def test_the_cli_imports_the_sdk_only_when_a_command_needs_it() -> None:
    """`raftbroker --help`, `--version`, usage errors and the start of `serve` do not wait for grpc,
    protobuf, pydantic or the CEL library (about half a second of imports): the command modules
    import the SDK inside the commands."""
    heavy = ("broker.client", "grpc", "google.protobuf", "pydantic", "cel", "broker.pipeline")
    script = ("import sys\n"
              "import broker.cli.main\n"
              f"print(','.join(m for m in {heavy!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"importing the CLI imports {done.stdout.strip()}"


def test_the_route_help_names_every_op_of_the_sdk() -> None:
    from broker.cli.route import OPS_TEXT
    from broker.client.models import OPS

    assert ", ".join(OPS) == OPS_TEXT


def test_version_prints_the_installed_distribution_version() -> None:
    from importlib.metadata import version

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"raftbroker {version('raftbroker')}\n"
