"""No value costs the leader more than its size times its schema's (``broker.leader.schemas``).

Each case is a schema or value measured to stall a leader before the fix: a backtracking pattern
(8 s for a 100 KB string), a chain of definitions that each refer to the one before twice (0.4 s
per valid value at 24 links, hours at 40), and the search for the field at fault in a deep value
against a recursive schema (18 s at depth 17, out of memory at 30).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from broker.core import errors
from broker.leader import schemas
from broker.leader.schema_explain import ExplainLimits, SchemaExplainer
from broker.leader.worker_pool import WorkerPool

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

# anyOf whose two branches both descend: finding the field at fault in [[...[0]...]] is 2^depth
BRANCHING = json.dumps({"$defs": {"a": {"anyOf": [
    {"type": "array", "items": {"$ref": "#/$defs/a"}, "maxItems": 1},
    {"type": "array", "items": {"$ref": "#/$defs/a"}}]}}, "$ref": "#/$defs/a"})


def nested(depth: int, leaf: object = 0) -> bytes:
    return ("[" * depth + json.dumps(leaf) + "]" * depth).encode()


def chain(links: int) -> str:
    defs: dict[str, object] = {"a0": {"type": "integer"}}
    for i in range(1, links + 1):
        defs[f"a{i}"] = {"allOf": [{"$ref": f"#/$defs/a{i - 1}"}, {"$ref": f"#/$defs/a{i - 1}"}]}
    return json.dumps({"$defs": defs, "$ref": f"#/$defs/a{links}"})


@pytest.fixture
def explainer() -> Iterator[SchemaExplainer]:
    e = SchemaExplainer(ExplainLimits(cpu_budget_s=1.0, wall_budget_s=30.0, quiet_s=2.0))
    yield e
    e.close()


@pytest.mark.parametrize("pattern", ["(?=(a*)*$)x", "^(a|b)\\1$", "(?<!x)y"])
def test_lookaround_and_backreferences_are_refused_at_create(pattern: str) -> None:
    cases: list[dict[str, object]] = [{"type": "string", "pattern": pattern}, {"patternProperties": {pattern: {}}}]
    for schema in cases:
        with pytest.raises(errors.InvalidArgument, match="linear-time engine: no lookaround or backreferences"):
            schemas.compile_schema(json.dumps(schema))


def test_a_pattern_checks_a_long_value_in_linear_time() -> None:
    compiled = schemas.compile_schema(json.dumps({"type": "string", "pattern": "^(a+)+$"}))
    cache = schemas.SchemaCache()
    started = time.process_time()
    with pytest.raises(errors.InvalidArgument, match="record 0: field"):
        cache.check_documents(1, json.dumps({"type": "string", "pattern": "^(a+)+$"}), [],
                              [json.dumps("a" * 1_000_000 + "!").encode()])
    assert time.process_time() - started < 5  # quadratic or worse would be minutes
    assert compiled.validator.is_valid("a" * 1000)


def test_a_chain_of_doubling_references_is_refused_at_create() -> None:
    schemas.compile_schema(chain(10))  # 2^10 nodes expanded: fine
    with pytest.raises(errors.InvalidArgument, match="schema_expanded_nodes_max"):
        schemas.compile_schema(chain(40))


@pytest.mark.parametrize(("schema", "said"), [
    ({"$ref": "other.json#/x"}, "external reference refused"),
    ({"$ref": "#/$defs/missing"}, "points at nothing"),
    ({"$ref": "#nowhere"}, "points at nothing"),
    ({"$dynamicRef": "#meta"}, r"\$dynamicRef is not supported"),
    ({"properties": {"a": {"$id": "http://x/a", "type": "string"}}}, r"\$id is allowed only at the root"),
])
def test_references_point_into_the_schema_itself(schema: object, said: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=said):
        schemas.compile_schema(json.dumps(schema))


def test_what_references_may_do() -> None:
    plain = schemas.compile_schema(json.dumps({"$defs": {"id": {"type": "integer"}}, "properties": {
        "a": {"$ref": "#/$defs/id"}, "b": {"$ref": "#/$defs/id"}, "c": {"$ref": "#idx"}},
        "$comment": "an anchor", "additionalProperties": {"$anchor": "idx", "type": "string"},
        "examples": [{"$ref": "data, not a reference"}]}))
    assert not plain.recursive
    boolean = schemas.compile_schema(json.dumps({"$defs": {"any": True, "none": False}, "properties": {
        "a": {"$ref": "#/$defs/any"}, "b": {"$ref": "#/$defs/none"}}}))
    assert boolean.validator.is_valid({"a": [1]}) and not boolean.validator.is_valid({"b": 1})
    assert plain.validator.is_valid({"a": 1, "b": 2, "c": "x"}) and not plain.validator.is_valid({"a": "1"})
    tree = schemas.compile_schema(json.dumps({"anyOf": [{"type": "string"},
                                                        {"type": "array", "items": {"$ref": "#"}}]}))
    assert tree.recursive and tree.validator.is_valid(json.loads(nested(100, "leaf")))
    assert schemas.compile_schema(BRANCHING).recursive
    # both branches descend on every level: deciding stays linear (jsonschema-rs memoizes recursive
    # references; were it not to, this would be 2^127 steps and the test's timeout would end it)
    both = json.dumps({"allOf": [{"items": {"$ref": "#"}}, {"items": {"$ref": "#"}, "maxItems": 3}]})
    assert schemas.SchemaCache().check_documents(9, both, [], [nested(127), nested(127, [])]) == []
    with pytest.raises(errors.InvalidArgument):
        schemas.SchemaCache().check_documents(9, json.dumps({"allOf": [{"items": {"$ref": "#"}}, {"type": "array"}]}),
                                              [], [nested(127)])


def test_a_deep_value_against_a_recursive_schema_is_refused_without_the_search(explainer: SchemaExplainer) -> None:
    cache = schemas.SchemaCache(explainer)
    shallow = r"record 0: field \(the document\): \[\[\[0\]\]\] is not valid under any"
    with pytest.raises(errors.InvalidArgument, match=shallow):
        cache.check_documents(7, BRANCHING, [], [nested(3)])  # shallow: the field is found
    started = time.monotonic()
    with pytest.raises(errors.InvalidArgument, match="record 1: the value does not satisfy the topic's schema "
                                                     r"\(the field at fault was not found within 1 s of CPU"):
        cache.check_documents(7, BRANCHING, [], [nested(2, []), nested(100)])
    assert time.monotonic() - started < 30
    assert explainer.breaches == 1
    with pytest.raises(errors.InvalidArgument, match="was not looked for: a value shortly before took more"):
        cache.check_documents(7, BRANCHING, [], [nested(3)])
    deadline = time.monotonic() + 10  # after the quiet period a new helper explains again
    while True:
        try:
            cache.check_documents(7, BRANCHING, [], [nested(3)])
        except errors.InvalidArgument as exc:
            if "[[[0]]] is not valid under any" in str(exc):
                break
            assert time.monotonic() < deadline, str(exc)
            time.sleep(0.2)
    assert cache.check_documents(7, BRANCHING, [], [nested(100, [])]) == []  # valid values pass at any depth


def test_a_stored_schema_this_version_refuses_fails_the_publish_precondition() -> None:
    cache = schemas.SchemaCache()
    legacy = json.dumps({"type": "string", "pattern": "(?=a)a"})  # accepted by versions before this one
    with pytest.raises(errors.FailedPrecondition, match="re-created with a schema that is accepted"):
        cache.check_documents(3, legacy, [], [b'"a"'])


def test_a_helper_that_dies_while_starting_leaves_a_plain_refusal() -> None:
    """A helper killed between its start and its "ready" (EOFError on the pipe) made the refused
    publish an INTERNAL error; now the pool says Unavailable and the explainer answers plainly."""
    pool = WorkerPool("broker.no_such_helper_module", workers_max=1, memory_bytes=256 << 20, start_timeout_s=10)
    with pytest.raises(errors.Unavailable, match="did not start"):
        pool.checkout()
    explainer = SchemaExplainer()
    explainer._pool = pool  # noqa: SLF001 - a helper that cannot start
    said = explainer.explain('{"type": "object"}', b"1")
    assert "its helper process did not start" in said, said


def test_a_schema_that_is_costly_to_compile_is_refused_in_the_helper() -> None:
    """7,000 patternProperties of ^\\w{N}$ (251 KB, under every size limit) took 7-17 s and 3.6 GB to
    compile, holding the GIL: each leader lost its leadership in turn. The compile is measured in the
    helper first, and one past the CPU budget (or the helper's limits) is refused."""
    cache = schemas.SchemaCache(SchemaExplainer(ExplainLimits(compile_cpu_max_s=0.05)))
    costly = json.dumps({"type": "object", "patternProperties": {f"^\\w{{{i}}}$": {} for i in range(1, 1200)}})
    with pytest.raises(errors.InvalidArgument, match=r"schema: compiling it took (more than|\d)"):
        cache.check_compile(costly)
    cache.check_compile(json.dumps({"type": "object", "properties": {"url": {"type": "string", "pattern": "^h"}}}))
    with pytest.raises(errors.InvalidArgument, match="lookaround"):
        cache.check_compile(json.dumps({"type": "string", "pattern": "(?=a)"}))
