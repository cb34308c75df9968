"""The chart's rendered objects (``helm template``, default and production values) have what issue 17
item 3 asks for. ``make helm-lint`` validates them against the Kubernetes schemas; this checks the
meaning, and the ServiceMonitor (a CRD kubernetes-validate has no schema for) field by field."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from broker.node import GRACE_S, TRANSFER_WAIT_S
from tests.container.chart import CHART, pod_template, render

pytestmark = [pytest.mark.unit]

HELM = os.environ.get("RAFTBROKER_HELM", str(Path(__file__).resolve().parents[2] / ".venv" / "tools" / "helm"))


def objects(*extra: str) -> dict[str, list[dict[str, Any]]]:
    if not Path(HELM).exists():
        pytest.fail(f"no helm at {HELM}: run `make helm-lint` (it installs helm) or set RAFTBROKER_HELM")
    out: dict[str, list[dict[str, Any]]] = {}
    for obj in render(HELM, "raftbroker", "test", extra):
        out.setdefault(obj["kind"], []).append(obj)
    return out


def test_default_values_render_a_three_node_statefulset() -> None:
    objs = objects()
    (sts,) = objs["StatefulSet"]
    spec = sts["spec"]
    assert spec["replicas"] == 3 and spec["podManagementPolicy"] == "Parallel"
    assert spec["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "raftbroker-health" in " ".join(c["readinessProbe"]["exec"]["command"])
    assert pod["terminationGracePeriodSeconds"] > TRANSFER_WAIT_S + GRACE_S
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (pdb,) = objs["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == 1
    headless = next(s for s in objs["Service"] if s["spec"].get("clusterIP") == "None")
    assert headless["spec"]["publishNotReadyAddresses"] is True and spec["serviceName"] == headless["metadata"]["name"]
    config = tomllib.loads(objs["ConfigMap"][0]["data"]["raftbroker.toml"])
    assert [p["id"] for p in config["peers"]] == [f"rb-raftbroker-{i}" for i in range(3)]
    tpl = pod_template([o for group in objs.values() for o in group])
    assert tpl.environment(1)["RAFTBROKER_RAFT_ADDRESS"] == config["peers"][1]["raft_address"]
    hooks = {j["metadata"]["annotations"]["helm.sh/hook"]: j for j in objs["Job"]}
    assert set(hooks) == {"pre-upgrade", "post-install,post-upgrade"}
    assert hooks["pre-upgrade"]["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "shrink"
    assert "ServiceMonitor" not in objs
    assert any(p["metadata"]["annotations"]["helm.sh/hook"] == "test" for p in objs["Pod"])


def test_production_values() -> None:
    objs = objects("-f", str(CHART / "values-production.yaml"))
    (sts,) = objs["StatefulSet"]
    assert sts["spec"]["replicas"] == 5
    config = tomllib.loads(objs["ConfigMap"][0]["data"]["raftbroker.toml"])
    assert len(config["peers"]) == 5
    mounts = {m["mountPath"] for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert {"/etc/raftbroker-tls", "/etc/raftbroker-auth"} <= mounts
    assert "Secret" not in objs  # the Raft secret is an existing one in production
    (sm,) = objs["ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["metadata"]["labels"]["release"] == "prometheus"
    selector = sm["spec"]["selector"]["matchLabels"]
    matched = [s for s in objs["Service"] if selector.items() <= s["metadata"]["labels"].items()]
    assert len(matched) == 1 and matched[0]["spec"]["clusterIP"] == "None"
    ports = {p["name"] for p in matched[0]["spec"]["ports"]}
    assert [e["port"] for e in sm["spec"]["endpoints"]] == ["metrics"] and "metrics" in ports
    desired = next(a for a in objs["Job"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
                   if a.startswith("--desired="))
    assert desired.count("=") == 1 + 5


def test_tls_without_a_secret_name_is_refused() -> None:
    proc = subprocess.run([HELM, "template", "rb", str(CHART), "--set", "tls.enabled=true"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "tls.secretName is required when tls.enabled" in proc.stderr, proc.stderr
