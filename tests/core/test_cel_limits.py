"""The static checks of CEL expressions and the evaluator sandbox's budgets (issue 11 item 4, issue 13 item 4)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from broker.core.errors import InvalidArgument, shown
from broker.leader import cel_check
from broker.leader.cel_sandbox import CelSandbox, ExpressionBudgetExceeded, SandboxLimits
from broker.leader.filters import RecordFilter

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

_L300 = "[" + ",".join(str(i) for i in range(300)) + "]"
_L200 = "[" + ",".join(str(i) for i in range(200)) + "]"


@pytest.mark.parametrize(("expression", "refusal"), [
    (f"{_L300}.all(a, {_L300}.all(b, {_L300}.all(c, a + b + c >= 0)))", "literal of 300 items"),
    (f"{_L200}.all(a, {_L200}.all(b, a + b >= 0))", "nests comprehensions"),
    ("value.items.all(x, value.items.exists(y, y == x))", "nests comprehensions"),
    ("size(value.a.map(x, value.b.filter(y, y > x))) > 0", "nests comprehensions"),
    ('key == "kk"', "bytes"),
    ('"kk" != key', "bytes"),
    ('key.startsWith("k")', "bytes"),
    ("value.amt", "boolean"),
    ("value.items.map(x, x.n)", "boolean"),
    ("1 + 2", "boolean"),
    ("x" * 5000, "longer than"),
])
def test_refused_filters(expression: str, refusal: str) -> None:
    with pytest.raises(InvalidArgument, match=refusal):
        cel_check.check(expression, "filter", boolean=True)


@pytest.mark.parametrize("expression", [
    f"{_L200}.all(a, a >= 0)", 'key == b"kk"', 'string(key) == "kk"', "(value.amt > 1)", "has(value.amt)",
    "!has(value.x)", "true", "value.items.exists(x, x.n > 2)", "size(value.items.filter(x, x > 1)) > 0",
    'value.type == "order.paid" && headers.source == "checkout"', "partition in [1, 2, 3]",
    "value.a ? true : false", 'value.s.startsWith("a")', '"a]b(".size() > 0 && value.x == "key"',
    'headers.key == "x"', 'value.key == "kk"', '{"a": 1, "b": 2}.size() == 2', "value.l[0] == 1",
    "value.a.all(x, x > 0) && value.b.exists(y, y < 0)",
])
def test_accepted_filters(expression: str) -> None:
    cel_check.check(expression, "filter", boolean=True)


@pytest.mark.parametrize("expression", ['value.status = "paid"', "(((", "value.", "value.amt >"])
def test_a_syntax_error_is_said_as_one(expression: str, sandbox: CelSandbox) -> None:
    """The parser runs before the token checks, which would call ``value.status = "paid"`` (one
    ``=``) a filter that yields a value."""
    with pytest.raises(InvalidArgument, match=r"invalid filter expression: .*(?i:syntax error)"):
        RecordFilter(expression, sandbox=sandbox)


def test_a_partition_key_need_not_be_boolean() -> None:
    cel_check.check("value.customer", "partition_key", boolean=False)


@pytest.fixture
def sandbox() -> Iterator[CelSandbox]:
    s = CelSandbox(SandboxLimits(record_budget_ms=50, call_budget_ms=1000, workers_max=1))
    yield s
    s.close()


def row(value: bytes) -> tuple[bytes | None, dict[str, str], str, int, int, bytes]:
    return None, {}, "insert", 0, 0, value


def test_an_over_budget_call_kills_its_evaluator_and_the_next_call_works(sandbox: CelSandbox) -> None:
    costly = b'{"items": [' + b",".join(str(i).encode() for i in range(20_000)) + b"]}"
    with pytest.raises(ExpressionBudgetExceeded, match="budget"):
        sandbox.evaluate("value.items.all(x, x in value.items)", [row(costly)])
    assert sandbox.budget_breaches == 1
    assert sandbox.evaluate("value.n > 1", [row(b'{"n": 2}'), row(b'{"n": 0}'), row(b"not json")]) == [
        ("v", True), ("v", False), ("e", sandbox.evaluate("value.n > 1", [row(b"x")])[0][1])]


def test_results_come_back_typed(sandbox: CelSandbox) -> None:
    [(kind, payload)] = sandbox.evaluate("value.a", [row(b'{"a": [1]}')])
    assert (kind, payload) == ("t", "list")
    assert sandbox.evaluate("value.a", [row(b'{"a": "s"}')]) == [("v", "s")]
    assert sandbox.evaluate("key", [(b"k", {}, "insert", 0, 0, b"")]) == [("v", b"k")]


def test_shown_cuts_long_inputs_and_says_their_length() -> None:
    assert shown("abc") == "'abc'"
    long = shown("n" * 100_000)
    assert len(long) < 200 and "100000 characters" in long


def test_a_node_starts_without_the_cel_library_and_preloads_it_off_the_start() -> None:
    """The CEL package imports its own command line (prompt_toolkit and more, ~0.4 s): a node's
    modules do not import it, ``filters.preload`` does on a thread, and a filter compiles after."""
    script = ("import sys\n"
              "import broker.node\n"
              "assert 'cel' not in sys.modules, 'a node module imports the CEL library at start'\n"
              "from broker.leader import filters\n"
              "filters.preload().join()\n"
              "assert 'cel' in sys.modules\n"
              "assert filters.RecordFilter('partition == 1') is not None\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
