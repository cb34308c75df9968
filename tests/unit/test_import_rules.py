"""The layout rules of docs/design/layout.md, checked on the imports of every module.

Every ``.py`` under ``broker/`` (but the generated ``broker/v1`` stubs) and ``chaos/`` is parsed with
``ast``; every ``import``/``from ... import`` (at any depth: function-level imports count) and every
``importlib.import_module("literal")`` / ``__import__("literal")`` is an import. A broken rule fails
with one line per offending import: ``path:line: module imports name (the rule)``.

Rules that work in flight on other branches will satisfy are marked ``xfail(strict=True)`` with the
branch named: when it lands they pass, the strict mark turns that into a failure, and the mark goes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "chaos")
GENERATED = "broker.v1"
PROTO_DIR = ROOT / "proto" / "broker" / "v1"
# what is stored and replicated, and read_view: the reader's server-side view of the internal
# SubscribeResponse (never sent; broker.leader.packed_reads checks a response with it)
INTERNAL_PROTOS = ("internal", "routes_internal", "read_view")

APPLY_SIDE = ("broker.core",)
APPLY_SIDE_MUST_NOT_IMPORT = ("broker.leader", "broker.services", "broker.replication")
# what makes code depend on when, on which thread or on chance: none of it on the apply side
NONDETERMINISTIC = ("time", "threading", "_thread", "datetime", "random", "secrets", "uuid", "asyncio",
                    "concurrent", "multiprocessing", "subprocess")
PUBLIC_STUB_IMPORTERS = ("broker.services", "broker.client", "broker.cli")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    path: str  # relative to the repository root
    line: int
    name: str  # what it imports, dotted (``from a import b`` gives ``a.b``)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.module} imports {self.name}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a relative ``from`` import."""
    if level == 0:
        return target or ""
    base = module.split(".")
    base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join([*base, target] if target else base)


def _imports_of(path: Path, module: str | None = None) -> list[Import]:
    """Every import in ``path``; ``module`` is its dotted name (default: from its place under ROOT)."""
    module = module or _module_name(path)
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    is_package = path.name == "__init__.py"
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
        if isinstance(node, ast.Import):
            found.extend(Import(module, rel, node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            found.append(Import(module, rel, node.lineno, base))
            found.extend(Import(module, rel, node.lineno, f"{base}.{alias.name}") for alias in node.names
                         if alias.name != "*")
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
            found.append(Import(module, rel, node.lineno, node.args[0].value))
    return found


@cache
def all_imports() -> tuple[Import, ...]:
    out: list[Import] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not _within(_module_name(path), (GENERATED,)):
                out.extend(_imports_of(path))
    return tuple(out)


def _within(name: str, prefixes: Iterable[str]) -> bool:
    """``name`` is one of ``prefixes`` or inside one of them (``a.b`` is within ``a``, ``ab`` is not)."""
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _proto_imports(name: str) -> list[str]:
    text = (PROTO_DIR / f"{name}.proto").read_text()
    return re.findall(r'^\s*import\s+(?:public\s+|weak\s+)?"broker/v1/(\w+)\.proto"\s*;', text, re.M)


@cache
def internal_stubs() -> frozenset[str]:
    """The stub modules of what the internal protos are built from: themselves and every proto they
    import, transitively (``broker.v1.internal_pb2``, ...). Computed from proto/, so it follows the
    protos as they change."""
    seen: set[str] = set()
    todo = list(INTERNAL_PROTOS)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_proto_imports(name))
    return frozenset(f"{GENERATED}.{name}_pb2" for name in seen)


@cache
def public_stubs() -> frozenset[str]:
    """Every other generated module: the public API's messages and every ``*_pb2_grpc`` service stub."""
    protos = [p.stem for p in PROTO_DIR.glob("*.proto")]
    messages = {f"{GENERATED}.{name}_pb2" for name in protos} - internal_stubs()
    return frozenset(messages | {f"{GENERATED}.{name}_pb2_grpc" for name in protos})


def broken(rule: str, importers: Callable[[Import], bool], forbidden: Callable[[str], bool]) -> list[str]:
    """One line per offending import statement: its shortest forbidden name (``from chaos.drill
    import A, B`` is reported once, as ``chaos.drill``)."""
    hits = [imp for imp in all_imports() if importers(imp) and forbidden(imp.name)]
    shortest: dict[tuple[str, int], Import] = {}
    for imp in hits:
        key = (imp.path, imp.line)
        if key not in shortest or len(imp.name) < len(shortest[key].name):
            shortest[key] = imp
    return [f"{imp}  ({rule})" for imp in shortest.values()]


def assert_none(violations: list[str]) -> None:
    assert not violations, "import rule broken:\n" + "\n".join(violations)


# -- the rules ------------------------------------------------------------------------------------
def test_the_apply_side_imports_nothing_from_the_leader_side_services_or_replication() -> None:
    assert_none(broken("the apply side (broker.core) imports nothing from broker.leader, broker.services "
                       "or broker.replication",
                       lambda imp: _within(imp.module, APPLY_SIDE),
                       lambda name: _within(name, APPLY_SIDE_MUST_NOT_IMPORT)))


def test_the_apply_side_imports_no_time_threads_or_randomness() -> None:
    assert_none(broken("apply-side modules are deterministic: no " + ", ".join(NONDETERMINISTIC),
                       lambda imp: _within(imp.module, APPLY_SIDE),
                       lambda name: _within(name, NONDETERMINISTIC)))


def test_broker_imports_no_chaos() -> None:
    assert_none(broken("broker imports no chaos", lambda imp: _within(imp.module, ("broker",)),
                       lambda name: _within(name, ("chaos",))))


def test_chaos_imports_no_broker_cli() -> None:
    assert_none(broken("chaos imports no broker.cli", lambda imp: _within(imp.module, ("chaos",)),
                       lambda name: _within(name, ("broker.cli",))))


def test_only_broker_replication_imports_pysyncobj() -> None:
    assert_none(broken("only broker/replication imports pysyncobj",
                       lambda imp: not _within(imp.module, ("broker.replication",)),
                       lambda name: _within(name, ("pysyncobj",))))


def test_only_the_rocks_store_imports_rocksdict() -> None:
    assert_none(broken("only broker/storage/rocks.py imports rocksdict",
                       lambda imp: imp.module != "broker.storage.rocks",
                       lambda name: _within(name, ("rocksdict",))))


def test_public_stubs_stay_out_of_the_server_side() -> None:
    assert_none(broken("the generated stubs of the public API are imported only by broker.services, "
                       "broker.client and broker.cli",
                       lambda imp: _within(imp.module, ("broker",)) and not _within(imp.module, PUBLIC_STUB_IMPORTERS)
                       and imp.module != "broker.devcluster",
                       lambda name: name in public_stubs()))


def test_public_stubs_stay_out_of_the_tools() -> None:
    assert_none(broken("the generated stubs of the public API are imported only by broker.services, "
                       "broker.client and broker.cli (tools talk through broker.client)",
                       lambda imp: _within(imp.module, ("chaos",)) or imp.module == "broker.devcluster",
                       lambda name: name in public_stubs()))


# -- the checker itself ---------------------------------------------------------------------------
def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    """Function-level, relative and importlib imports are all seen (a rule cannot pass by a blind spot)."""
    source = ("import time as t\nfrom . import records\nfrom ..leader import reading\n"
              "def f():\n    from broker.services import errors\n    importlib.import_module('chaos.drill')\n")
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    names = {(i.line, i.name) for i in _imports_of(probe, "broker.core.probe")}
    assert names >= {(1, "time"), (2, "broker.core.records"), (3, "broker.leader.reading"),
                     (5, "broker.services.errors"), (6, "chaos.drill")}


def test_every_package_is_read_and_the_stub_sets_are_sound() -> None:
    modules = {imp.module for imp in all_imports()}
    for expected in ("broker.core.state_machine", "broker.leader.topic_log", "broker.services.server",
                     "broker.replication.raft", "chaos.drill"):
        assert expected in modules, f"{expected} was not read"
    assert f"{GENERATED}.internal_pb2" in internal_stubs()
    assert f"{GENERATED}.broker_pb2" in public_stubs()
    assert not internal_stubs() & public_stubs()
