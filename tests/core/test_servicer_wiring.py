"""The node is built in one pass (issue 14, item 5): every service a servicer delegates to is given
to its constructor; no servicer attribute starts as None, and no RPC answers UNIMPLEMENTED until
something is attached later."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from broker.services.admin_service import AdminServicer
from broker.services.broker_service import BrokerServicer

pytestmark = pytest.mark.unit


def assigned_in_init(cls: type) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))  # type: ignore[misc]
    return {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


@pytest.mark.parametrize("servicer", [BrokerServicer, AdminServicer], ids=lambda c: c.__name__)
def test_every_service_a_servicer_delegates_to_is_given_by_its_constructor(servicer: type) -> None:
    mixins = [c for c in servicer.__mro__[1:] if c.__module__.startswith("broker.services.")]
    assert mixins, "the servicer's RPC groups"
    declared = {name for c in mixins for name in getattr(c, "__annotations__", {})}
    assert declared, "the mixins declare what they delegate to"
    for c in mixins:
        unset = {name for name in getattr(c, "__annotations__", {}) if name in vars(c)}
        assert not unset, f"{c.__name__} gives {sorted(unset)} a class-level default (set later: nullable)"
    assert declared <= assigned_in_init(servicer), "set by the constructor"
    required = {name for name, p in inspect.signature(servicer).parameters.items() if p.default is p.empty}
    assert {name.lstrip("_") for name in declared} <= required, "and required by it"
