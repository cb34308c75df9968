"""Server-side record filters and route partition keys in CEL (SPEC §3.4).

Variables and their types: ``key`` (bytes, or null: compare with ``b"..."`` or ``string(key)``),
``headers`` (map of string to string), ``op`` ("insert", "update", "delete", "tombstone"),
``partition`` (int), ``timestamp_ms`` (int) and ``value``: the JSON document when the value is
JSON, else its raw bytes. A record matches when the filter evaluates to ``true``; an evaluation
error (for example a missing field: use ``has(value.field)``) means no match.

An expression is accepted only after the static checks of :mod:`broker.leader.cel_check` (length,
no nested comprehensions, bounded literals; a filter must be boolean; no string comparison of
``key``) and a trial evaluation on a synthetic record within the budget. Every evaluation runs in
:mod:`broker.leader.cel_sandbox` evaluator processes, never in the broker's own (CEL holds the GIL),
with a budget per record and per call: a breach raises ``ExpressionBudgetExceeded``.
CEL library: ``common-expression-language`` (Rust core), ~9 us per evaluation.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from broker.core.errors import InvalidArgument, shown
from broker.leader import cel_check, cel_sandbox
from broker.v1 import internal_pb2

_OPS = {v: k.removeprefix("OP_").lower() for k, v in internal_pb2.Op.items()}
_VARIABLES = {"key", "headers", "op", "partition", "timestamp_ms", "value"}
_TRIAL_ROW: cel_sandbox.Row = (b"k", {"h": "v"}, "insert", 0, 0, b'{"a": 1}')


def _cel() -> ModuleType:
    """The CEL library, imported on first use: its package also imports its own command line
    (prompt_toolkit, typer, rich), ~0.4 s that a node's start-up does not wait for."""
    import cel

    return cel


def preload() -> threading.Thread:
    """Import the CEL library on a thread of its own, so that the first filter does not pay for it
    on the event loop (a caller that needs it sooner waits on the import lock; nothing else does).
    Not a daemon: a process that exits meanwhile waits for the import to end."""
    thread = threading.Thread(target=_cel, name="cel-preload")
    thread.start()
    return thread


def _row(record: internal_pb2.Record, needs_value: bool) -> cel_sandbox.Row:
    key = record.key if record.HasField("key") else None
    op = _OPS.get(record.op, "insert")
    return key, dict(record.headers), op, record.partition, record.timestamp_ms, record.value if needs_value else b""


class RecordExpression:
    """A checked CEL expression over records (filters, route partition keys); ``what`` names it in
    error messages. Construction raises :class:`InvalidArgument` for an expression to refuse."""

    boolean = False

    def __init__(self, expression: str, what: str = "filter",
                 sandbox: cel_sandbox.CelSandbox | None = None) -> None:
        cel_check.check_length(expression, what)
        try:  # the parser first: a syntax error is said as one, not as what the token checks infer
            program = _cel().compile(expression)
        except (ValueError, RuntimeError) as exc:
            raise InvalidArgument(f"invalid {what} expression: {shown(str(exc), quote=False, chars_max=400)}") from None
        cel_check.check(expression, what, self.boolean)
        unknown = set(program.variables()) - _VARIABLES - _bound_names(expression)
        if unknown:
            names = shown(", ".join(sorted(unknown)), quote=False)
            raise InvalidArgument(f"invalid {what} expression: unknown variable(s) {names}; "
                                  f"use {', '.join(sorted(_VARIABLES))}")
        self._needs_value = "value" in program.variables()
        self._sandbox = sandbox or cel_sandbox.shared()
        self.expression = expression
        self.what = what
        self._trial()

    def _trial(self) -> None:
        """Evaluate once on a synthetic record: refuse what breaks the budget there already."""
        try:
            [(kind, payload)] = self._sandbox.evaluate(self.expression, [_TRIAL_ROW])
        except cel_sandbox.ExpressionBudgetExceeded as exc:
            raise InvalidArgument(f"{self.what} is too costly: {exc}") from None
        if self.boolean and kind in ("v", "t") and not isinstance(payload, bool):
            raise InvalidArgument(f"{self.what} must be true or false per record; on a sample record it "
                                  f"yields {type(payload).__name__ if kind == 'v' else payload}")

    def evaluate_many(self, records: Sequence[internal_pb2.Record]) -> list[tuple[str, Any]]:
        """``(kind, payload)`` per record (see :mod:`broker.leader.cel_worker`); raises
        ``ExpressionBudgetExceeded`` when the budget is broken."""
        return self._sandbox.evaluate(self.expression, [_row(r, self._needs_value) for r in records])


class RecordFilter(RecordExpression):
    """A filter: a record matches when the expression is ``true``."""

    boolean = True

    def select(self, records: Sequence[internal_pb2.Record]) -> list[bool]:
        """Whether each record matches; an evaluation error is no match, a non-boolean result raises
        :class:`InvalidArgument` (the filter is wrong, not the record)."""
        out = []
        for record, (kind, payload) in zip(records, self.evaluate_many(records), strict=True):
            if kind == "e":
                out.append(False)
            elif kind == "v" and isinstance(payload, bool):
                out.append(payload)
            else:
                got = type(payload).__name__ if kind == "v" else payload
                raise InvalidArgument(f"{self.what} yields {got}, not true/false, for record {record.offset} of "
                                      f"partition {record.partition}: a filter must be a boolean expression")
        return out


def _bound_names(expression: str) -> set[str]:
    """Names bound by comprehensions (``x`` in ``list.all(x, ...)``), which CEL reports as variables."""
    toks = cel_check.tokens(expression)
    names = set()
    for i in range(len(toks) - 3):
        if (toks[i].text == "." and toks[i + 1].text in cel_check.COMPREHENSIONS and toks[i + 2].text == "("
                and toks[i + 3].kind == "ident"):
            names.add(toks[i + 3].text)
    return names
