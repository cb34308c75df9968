"""The schema explainer process (``python -m broker.leader.schema_worker FD MEMORY_BYTES``).

Finds the field at fault in a value that a topic's recursive schema refuses, which can take time
exponential in the value's depth (:mod:`broker.leader.schemas`), so the broker never does it in
its own process (:mod:`broker.leader.schema_explain`). A request is ``(schema_json, value,
cpu_budget_s)``; the answer is ``("ok", message)`` (None if the value is valid after all, or an
InvalidArgument's text if the schema or value is refused). With ``value`` None the request measures
what compiling the schema costs (:func:`compile_cost`), before a topic is created with it.
Before each request the process's CPU limit is set ``cpu_budget_s`` (rounded up to whole seconds)
past what it has used, so the kernel ends it with SIGXCPU once a request overruns: the budget is
CPU time, which a busy machine does not spend for it. Keep this module's imports small: it is started on demand.
"""

from __future__ import annotations

import math
import resource
from multiprocessing.connection import Connection

from broker.core.errors import InvalidArgument
from broker.leader import schemas
from broker.leader.worker_pool import worker_main

SCHEMAS_MAX = 16


def _cpu_used_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def explain(compiled: dict[str, schemas.CompiledSchema], schema_json: str, value: bytes) -> str | None:
    try:
        schema = compiled.get(schema_json)
        if schema is None:
            if len(compiled) >= SCHEMAS_MAX:
                compiled.clear()
            schema = compiled[schema_json] = schemas.compile_schema(schema_json)
        return schemas.first_error(schema.validator, schemas.parse_json(0, value))
    except InvalidArgument as exc:
        return str(exc)


def compile_cost(schema_json: str) -> tuple[str, float | str]:
    """("compiled", CPU seconds the compile took) or ("refused", the InvalidArgument's text)."""
    before = _cpu_used_s()
    try:
        schemas.compile_schema(schema_json)
    except InvalidArgument as exc:
        return "refused", str(exc)
    return "compiled", _cpu_used_s() - before


def serve(conn: Connection) -> None:
    """Answer requests until the parent closes the connection."""
    compiled: dict[str, schemas.CompiledSchema] = {}
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    conn.send(("ready",))
    while True:
        try:
            schema_json, value, cpu_budget_s = conn.recv()
        except EOFError:
            return
        soft = math.ceil(_cpu_used_s() + cpu_budget_s)
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
        conn.send(compile_cost(schema_json) if value is None else ("ok", explain(compiled, schema_json, value)))


if __name__ == "__main__":
    worker_main(serve)
