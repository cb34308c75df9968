"""What an operator walking docs/deploy.md meets beyond the default and production values: other
replica counts, long or dotted release names, `helm test` and `helm rollback` (``helm template``)."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.container.chart import CHART

pytestmark = [pytest.mark.unit]

HELM = os.environ.get("RAFTBROKER_HELM", str(Path(__file__).resolve().parents[2] / ".venv" / "tools" / "helm"))


def render(release: str, *sets: str) -> list[dict[str, Any]]:
    if not Path(HELM).exists():
        pytest.fail(f"no helm at {HELM}: run `make helm-lint` (it installs helm) or set RAFTBROKER_HELM")
    args = [a for s in sets for a in ("--set", s)]
    out = subprocess.run([HELM, "template", release, str(CHART), "--namespace", "brokers", *args],
                         capture_output=True, text=True, timeout=120, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 5, 7])
def test_the_disruption_budget_never_takes_the_majority(replicas: int) -> None:
    """Voluntary disruptions the PDB allows leave a majority of the members running, for every
    replica count and whatever maxUnavailable asks (1 or 2 nodes: none allowed)."""
    for asked in (1, 3):
        objs = render("rb", f"replicaCount={replicas}", f"podDisruptionBudget.maxUnavailable={asked}")
        (pdb,) = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
        allowed = pdb["spec"]["maxUnavailable"]
        assert replicas - allowed >= replicas // 2 + 1, (replicas, asked, allowed)
        assert allowed == min(asked, (replicas - 1) // 2)


def test_only_the_broker_pods_carry_the_statefulsets_selector_labels() -> None:
    """The PDB, both Services and the pods' anti-affinity select by the StatefulSet's selector labels;
    the `helm test` pod and the hook Jobs' pods must not match them (the test pod would otherwise be
    counted by the PDB as an unmanaged pod, and hard anti-affinity would keep it off every node that
    runs a broker)."""
    objs = render("rb")
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet"]
    selector = sts["spec"]["selector"]["matchLabels"]
    assert _selects(selector, sts["spec"]["template"]["metadata"]["labels"])
    (pdb,) = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    affinity = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    selectors = [pdb["spec"]["selector"]["matchLabels"],
                 affinity["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]["matchLabels"],
                 *(s["spec"]["selector"] for s in objs if s["kind"] == "Service")]
    others = [o["metadata"]["labels"] for o in objs if o["kind"] == "Pod"]
    others += [o["spec"]["template"]["metadata"]["labels"] for o in objs if o["kind"] == "Job"]
    assert len(others) == 3
    for sel in selectors:
        for labels in others:
            assert not _selects(sel, labels), (sel, labels)


def test_the_membership_hooks_also_run_on_rollback() -> None:
    """`helm rollback` to a revision with another replicaCount changes the StatefulSet as an upgrade
    does; the Raft membership must follow (shrink before, grow after)."""
    jobs = {j["metadata"]["name"]: j["metadata"]["annotations"]["helm.sh/hook"]
            for j in render("rb") if j["kind"] == "Job"}
    assert jobs == {"rb-raftbroker-membership-shrink": "pre-upgrade,pre-rollback",
                    "rb-raftbroker-membership-grow": "post-install,post-upgrade,post-rollback"}


@pytest.mark.parametrize("release", ["a-very-long-release-name-that-goes-on-and-on-and-on-x", "my.release",
                                     "rb-raftbroker-staging.eu"])
def test_names_are_valid_for_any_release_name_helm_accepts(release: str) -> None:
    """Helm accepts release names up to 53 characters, with dots. Services and the pods' host names
    must be DNS labels (no dots, at most 63 characters), and so must a Job's name (the label
    `job-name` its pods get); the StatefulSet's name at most 52 (its pods' controller-revision-hash
    label adds 11)."""
    objs = render(release)
    for obj in objs:
        name = obj["metadata"]["name"]
        if obj["kind"] in ("Service", "Job", "StatefulSet"):
            assert "." not in name and len(name) <= 63, (obj["kind"], name)
        if obj["kind"] == "StatefulSet":
            assert len(name) <= 52, name
    names = [o["metadata"]["name"] for o in objs if o["kind"] == "Job"]
    assert len(set(names)) == 2


def _covered(host: str, names: list[str]) -> bool:
    """TLS host name check: a wildcard stands for exactly one leftmost label."""
    return any(host == n or (n.startswith("*.") and host.split(".", 1)[-1] == n[2:] and "." in host) for n in names)


def test_every_tls_client_of_the_chart_connects_by_a_name_the_certificate_carries() -> None:
    """docs/deploy.md "TLS and tokens": one node certificate for `*.RELEASE-raftbroker-headless.NS.svc.DOMAIN`
    and `RELEASE-raftbroker.NS.svc.DOMAIN`. The readiness probe, the membership hooks, `helm test` and
    client.toml must connect by those names, or TLS refuses them (the hooks used the headless
    Service's own name, which the wildcard does not cover: every upgrade's pre-upgrade hook failed)."""
    objs = render("rb", "tls.enabled=true", "tls.secretName=t", "auth.enabled=true", "auth.secretName=a",
                  "auth.clientSecretName=c")
    cert = ["*.rb-raftbroker-headless.brokers.svc.cluster.local", "rb-raftbroker.brokers.svc.cluster.local"]
    hosts = []
    for job in (o for o in objs if o["kind"] == "Job"):
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        boot = next(a for a in args if a.startswith("--bootstrap="))
        hosts += [b.rsplit(":", 1)[0] for b in boot.split("=", 1)[1].split(",")]
        desired = next(a for a in args if a.startswith("--desired="))
        hosts += [m.split("/")[1].rsplit(":", 1)[0] for m in desired.split("=", 1)[1].split(",")]
    (test_pod,) = [o for o in objs if o["kind"] == "Pod"]
    env = {e["name"]: e.get("value") for e in test_pod["spec"]["containers"][0]["env"]}
    hosts.append(env["RAFTBROKER_BOOTSTRAP"].rsplit(":", 1)[0])
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    hosts += [b.rsplit(":", 1)[0] for b in tomllib.loads(cm["data"]["client.toml"])["bootstrap"]]
    (sts,) = [o for o in objs if o["kind"] == "StatefulSet"]
    pod_env = {e["name"]: e.get("value") for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    hosts.append(pod_env["RAFTBROKER_GRPC_ADDRESS"].replace("$(POD_NAME)", "rb-raftbroker-0").rsplit(":", 1)[0])
    assert len(hosts) == 2 + 2 * 3 + 1 + 1 + 1
    for host in hosts:
        assert _covered(host, cert), host
