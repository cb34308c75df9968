"""The CEL evaluator process (``python -m broker.leader.cel_worker FD MEMORY_BYTES``).

CEL evaluation holds the GIL for as long as it runs, so the broker never evaluates a user's
expression in its own process: :mod:`broker.leader.cel_sandbox` sends batches of records here over
a socket and kills this process when a batch overruns its budget. Requests are
``(expression, rows, record_budget_s)``; a row is ``(key, headers, op, partition, timestamp_ms,
value)``. The answer is ``("ok", results)`` with one ``(kind, payload)`` per row: ``("v", value)``
for a bool, number, string, bytes or null, ``("t", type name)`` for any other value, ``("e",
message)`` for an evaluation error; or ``("slow", index, elapsed_s)`` as soon as one row took more
CPU time than ``record_budget_s`` (the rest are not evaluated). Keep this module's imports small: it is
started on demand.
"""

from __future__ import annotations

import json
import time
from multiprocessing.connection import Connection
from typing import Any

import cel

from broker.leader.worker_pool import worker_main

PROGRAMS_MAX = 64
_PLAIN = (bool, int, float, str, bytes, type(None))


def _activation(row: tuple[Any, ...], needs_value: bool) -> dict[str, Any]:
    key, headers, op, partition, timestamp_ms, value = row
    activation = {"key": key, "headers": headers, "op": op, "partition": partition, "timestamp_ms": timestamp_ms}
    if needs_value:
        try:
            activation["value"] = json.loads(value)
        except (ValueError, RecursionError):  # not JSON (or absurdly deep): the raw bytes
            activation["value"] = value
    return activation


def _evaluate(program: Any, needs_value: bool, row: tuple[Any, ...]) -> tuple[str, Any]:
    try:
        result = program.execute(_activation(row, needs_value))
    except Exception as exc:  # noqa: BLE001 - any CEL evaluation error is reported, not fatal
        return "e", str(exc)[:200]
    return ("v", result) if isinstance(result, _PLAIN) else ("t", type(result).__name__)


def serve(conn: Connection) -> None:
    """Answer requests until the parent closes the connection."""
    programs: dict[str, tuple[Any, bool]] = {}
    conn.send(("ready",))
    while True:
        try:
            expression, rows, record_budget_s = conn.recv()
        except EOFError:
            return
        compiled = programs.get(expression)
        if compiled is None:
            if len(programs) >= PROGRAMS_MAX:
                programs.clear()
            program = cel.compile(expression)
            compiled = programs[expression] = (program, "value" in program.variables())
        results: list[tuple[str, Any]] = []
        answer: tuple[Any, ...] = ("ok", results)
        for i, row in enumerate(rows):
            started = time.thread_time()  # CPU time: a busy machine that descheduled us is no breach
            results.append(_evaluate(compiled[0], compiled[1], row))
            elapsed = time.thread_time() - started
            if elapsed > record_budget_s:
                answer = ("slow", i, elapsed)
                break
        conn.send(answer)


if __name__ == "__main__":
    worker_main(serve)
