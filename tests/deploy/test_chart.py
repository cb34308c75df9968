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
    assert set(hooks) == {"pre-upgrade,pre-rollback", "post-install,post-upgrade,post-rollback"}
    assert hooks["pre-upgrade,pre-rollback"]["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "shrink"
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


def _container(objs: dict[str, list[dict[str, Any]]], kind: str, name_part: str = "") -> dict[str, Any]:
    obj = next(o for o in objs[kind] if name_part in o["metadata"]["name"])
    spec = obj["spec"]["template"]["spec"] if kind in ("StatefulSet", "Job") else obj["spec"]
    return {"container": spec["containers"][0], "volumes": {v["name"]: v for v in spec.get("volumes", [])}}


def test_production_values_run_the_security_settings(tmp_path: Path) -> None:
    """Secured (tls + auth): no --insecure; TLS, tokens, ACL and the Raft password as files from the
    Secrets; the probe, hook Jobs and helm test pod use the ConfigMap's client.toml. The rendered
    environment, with the mounted files in place, is a NodeConfig that binds its DNS name without
    --insecure (authenticated) and reads the Raft secret from the file; client.toml loads."""
    objs = objects("-f", str(CHART / "values-production.yaml"))
    pod = _container(objs, "StatefulSet")
    c = pod["container"]
    assert "--insecure" not in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert "RAFTBROKER_RAFT_PASSWORD" not in env and "RAFTBROKER_TLS_CLIENT_CA_FILE" not in env
    files = {k: v["value"] for k, v in env.items() if k.endswith("_FILE")}
    assert files == {"RAFTBROKER_RAFT_PASSWORD_FILE": "/etc/raftbroker-raft/password",
                     "RAFTBROKER_TLS_CERT_FILE": "/etc/raftbroker-tls/tls.crt",
                     "RAFTBROKER_TLS_KEY_FILE": "/etc/raftbroker-tls/tls.key",
                     "RAFTBROKER_TLS_CA_FILE": "/etc/raftbroker-tls/ca.crt",
                     "RAFTBROKER_TOKENS_FILE": "/etc/raftbroker-auth/tokens.toml",
                     "RAFTBROKER_ACL_FILE": "/etc/raftbroker-auth/acl.toml"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    secrets = {name: v["secret"]["secretName"] for name, v in pod["volumes"].items() if "secret" in v}
    assert {d: secrets.get(n) for d, n in mounts.items() if n in secrets} == {
        "/etc/raftbroker-tls": "raftbroker-tls", "/etc/raftbroker-auth": "raftbroker-auth",
        "/etc/raftbroker-client": "raftbroker-client", "/etc/raftbroker-raft": "raftbroker-raft"}
    for path in files.values():  # every file the node is given is in a mounted Secret
        assert mounts.get(str(Path(path).parent)) in secrets, path
    probe = " ".join(c["readinessProbe"]["exec"]["command"])
    assert "--client-config /etc/raftbroker/client.toml" in probe
    client_toml = objs["ConfigMap"][0]["data"]["client.toml"]
    assert "cert_file" not in client_toml  # no mTLS in these values
    for kind, part in (("Job", "shrink"), ("Job", "grow"), ("Pod", "test")):
        user = _container(objs, kind, part)
        user_env = {e["name"]: e.get("value") for e in user["container"]["env"]}
        assert user_env["RAFTBROKER_CLIENT_CONFIG"] == "/etc/raftbroker/client.toml", (kind, part)
        assert {m["mountPath"] for m in user["container"]["volumeMounts"]} == {
            "/etc/raftbroker", "/etc/raftbroker-tls", "/etc/raftbroker-client"}
        assert user["volumes"]["client"]["secret"]["secretName"] == "raftbroker-client"
        assert user["volumes"]["tls"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # no node key

    # what the node and the probes make of it, with the Secrets' files under tmp_path
    from broker.client import load_client_config
    from broker.config import load_config
    from broker.security.devcerts import DevSecurity

    dev = DevSecurity(tmp_path / "dev").ensure(["127.0.0.1:7001"])
    dev.node_args("n1")  # issues the node certificate
    node_cert, node_key = dev.node_cert("n1")
    root = tmp_path / "root"
    content = {"/etc/raftbroker-tls/tls.crt": node_cert.read_bytes(),
               "/etc/raftbroker-tls/tls.key": node_key.read_bytes(),
               "/etc/raftbroker-tls/ca.crt": dev.ca_file.read_bytes(),
               "/etc/raftbroker-auth/tokens.toml": dev.tokens_file.read_bytes(),
               "/etc/raftbroker-auth/acl.toml": dev.acl_file.read_bytes(),
               "/etc/raftbroker-client/token": dev.admin_token_file.read_bytes(),
               "/etc/raftbroker-raft/password": b"s3cret-from-the-secret\n",
               "/etc/raftbroker/client.toml": client_toml.replace('"/etc/', f'"{root}/etc/').encode()}
    for path, data in content.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_bytes(data)
    environ = {k: (str(root) + v["value"] if k.endswith("_FILE") else v["value"]) for k, v in env.items()
               if "value" in v}
    environ["RAFTBROKER_NODE_ID"] = "rb-raftbroker-0"
    environ = {k: v.replace("$(POD_NAME)", "rb-raftbroker-0") for k, v in environ.items()}
    environ["RAFTBROKER_RAFT_PASSWORD_SALT"] = "salt-from-the-secret"
    cfg_file = tmp_path / "raftbroker.toml"
    cfg_file.write_text(objs["ConfigMap"][0]["data"]["raftbroker.toml"])
    cfg = load_config(cfg_file, {"data_dir": tmp_path / "data"}, environ)  # no --insecure: accepted
    assert cfg.authenticated and not cfg.insecure and cfg.grpc_address.startswith("rb-raftbroker-0.")
    assert cfg.raft_secret() == "s3cret-from-the-secret"
    loaded = load_client_config(root / "etc/raftbroker/client.toml")
    assert loaded is not None and loaded.security.ca_pem == dev.ca_file.read_bytes()
    assert loaded.bootstrap == ("rb-raftbroker.default.svc.cluster.local:7001",)
    assert loaded.security.token_file == root / "etc/raftbroker-client/token"


def test_mtls_values_give_the_client_ca_and_a_client_certificate() -> None:
    objs = objects("-f", str(CHART / "values-production.yaml"), "--set", "tls.clientAuth=true",
                   "--set", "tls.principalFromCert=true")
    env = {e["name"]: e.get("value") for e in _container(objs, "StatefulSet")["container"]["env"]}
    assert env["RAFTBROKER_TLS_CLIENT_CA_FILE"] == "/etc/raftbroker-tls/ca.crt"
    assert env["RAFTBROKER_TLS_PRINCIPAL_FROM_CERT"] == "true"
    client = tomllib.loads(objs["ConfigMap"][0]["data"]["client.toml"])
    assert (client["cert_file"], client["key_file"]) == ("/etc/raftbroker-tls/tls.crt", "/etc/raftbroker-tls/tls.key")
    assert "items" not in _container(objs, "Job", "grow")["volumes"]["tls"]["secret"]  # the key is needed now


def test_default_values_stay_plaintext_with_insecure() -> None:
    objs = objects()
    c = _container(objs, "StatefulSet")["container"]
    assert "--insecure" in c["args"] and "client.toml" not in objs["ConfigMap"][0]["data"]
    assert not any(e["name"].startswith("RAFTBROKER_TLS") for e in c["env"])
    assert "env" not in _container(objs, "Job", "grow")["container"]


@pytest.mark.parametrize(("sets", "message"), [
    (["tls.enabled=true"], "tls.secretName is required when tls.enabled"),
    (["auth.enabled=true", "auth.clientSecretName=c"], "auth.secretName is required when auth.enabled"),
    (["auth.enabled=true", "auth.secretName=a"], "auth.clientSecretName is required when auth.enabled"),
    (["auth.enabled=true", "auth.secretName=a", "auth.clientSecretName=c"], "auth.enabled needs tls.enabled"),
    (["tls.enabled=true", "tls.secretName=t"], "tls.enabled needs auth.enabled"),
    (["tls.principalFromCert=true"], "tls.principalFromCert needs tls.clientAuth"),
])
def test_half_configured_security_is_refused(sets: list[str], message: str) -> None:
    args = [a for s in sets for a in ("--set", s)]
    proc = subprocess.run([HELM, "template", "rb", str(CHART), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
