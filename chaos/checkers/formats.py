"""The cluster's command format through a rolling upgrade (``chaos.nemeses.upgrade``): it must not
rise while any member runs a release that cannot apply the new format (``format-raised-early``),
and it must rise once every member can (``format-not-raised``). Reads the nemesis's ``formats``
records: before each node's upgrade, and after the last until every node reports the new format.
"""

from __future__ import annotations

from chaos.checkers.model import Violation, violation
from chaos.history import Entry


def check_formats(entries: list[Entry]) -> list[Violation]:
    records = [e for e in entries if e.type == "info" and e.f == "formats" and isinstance(e.value, dict)]
    out: list[Violation] = []
    for e in records:
        value = e.value
        nodes: dict[str, dict[str, int]] = value["nodes"]
        older = sorted(n for n, f in nodes.items() if f["apply"] < value["code_format"])
        early = sorted(f"{n}: cluster format {f['cluster']}" for n, f in nodes.items()
                       if older and f["cluster"] > min(nodes[o]["apply"] for o in older))
        if early:
            out.append(violation("format-raised-early", f"{value['moment']}: the cluster's command format rose past "
                                 f"what {', '.join(older)} apply", early, [e.index]))
    finals = [e for e in records if e.value["moment"] == "after the last upgrade"]
    if finals:
        last = finals[-1].value
        behind = sorted(f"{n}: cluster format {f['cluster']}" for n, f in last["nodes"].items()
                        if f["cluster"] != last["code_format"])
        named = {n for e in records for n in e.value["nodes"]}
        behind += sorted(f"{n}: did not answer" for n in named - set(last["nodes"]))
        if behind:
            out.append(violation("format-not-raised", "every member runs the new release, and the cluster's "
                                 f"command format did not rise to {last['code_format']} within the wait",
                                 behind, [finals[-1].index]))
    return out
