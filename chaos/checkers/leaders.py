"""At most one leader per term (Raft's election safety), from status polls of every node: two
different nodes that each reported ``role=leader`` for the same term is a split brain."""

from __future__ import annotations

from collections import defaultdict

from chaos.checkers.model import Model, Violation, violation


def check_leaders(model: Model) -> list[Violation]:
    leaders: dict[int, dict[str, int]] = defaultdict(dict)  # term -> node -> first entry
    for e in model.entries:
        if e.type == "info" and e.f == "status" and e.value.get("role") == "leader":
            leaders[int(e.value["term"])].setdefault(str(e.value["node"]), e.index)
    return [violation("multiple-leaders", f"{len(nodes)} nodes were leader in term {term}",
                      [f"term {term}: {n}" for n in sorted(nodes)], sorted(nodes.values()))
            for term, nodes in sorted(leaders.items()) if len(nodes) > 1]


def terms_seen(model: Model) -> int:
    """Distinct terms in which some node reported itself leader."""
    return len({int(e.value["term"]) for e in model.entries
                if e.type == "info" and e.f == "status" and e.value.get("role") == "leader"})
