"""What the Helm chart renders for its StatefulSet pods, turned into what ``docker run`` needs: the
container's command line, environment (downward-API fields, Secret keys and ``$(VAR)`` references
resolved as the kubelet does), the config files of its ConfigMap, its user, read-only root
filesystem, the pod's hostname and DNS domain. Read from ``helm template`` output, so the container
tier tests the chart's configuration, not a copy of it."""

from __future__ import annotations

import base64
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "raftbroker"
NAMESPACE = "default"
RELEASE = "rb"
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class PodTemplate:
    """The StatefulSet's pod, as far as a container engine can reproduce it."""

    statefulset: str
    replicas: int
    domain: str  # HEADLESS.NAMESPACE.svc.DOMAIN
    command: list[str] | None  # None: the image's entrypoint
    args: list[str]
    env: list[dict[str, Any]]
    secrets: dict[str, dict[str, str]]  # name -> key -> decoded value
    config_files: dict[str, str]  # file name -> content (the ConfigMap mounted at config_mount)
    config_mount: str
    user: str
    read_only_root: bool
    grpc_port: int
    tmp_mounts: list[str]

    def pod_name(self, ordinal: int) -> str:
        return f"{self.statefulset}-{ordinal}"

    def fqdn(self, ordinal: int) -> str:
        return f"{self.pod_name(ordinal)}.{self.domain}"

    def environment(self, ordinal: int) -> dict[str, str]:
        """The container's environment for pod ``ordinal``, in order, references expanded."""
        out: dict[str, str] = {}
        for var in self.env:
            if "value" in var:
                value = _REF.sub(lambda m: out.get(m.group(1), m.group(0)), str(var["value"]))
            elif "fieldRef" in var.get("valueFrom", {}):
                path = var["valueFrom"]["fieldRef"]["fieldPath"]
                value = {"metadata.name": self.pod_name(ordinal), "metadata.namespace": NAMESPACE}[path]
            else:
                ref = var["valueFrom"]["secretKeyRef"]
                value = self.secrets[ref["name"]][ref["key"]]
            out[var["name"]] = value
        return out


def render(helm: str, image_repository: str, image_tag: str, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every object ``helm template`` renders for the chart (default values plus ``extra`` flags)."""
    out = subprocess.run([helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                          "--set", f"image.repository={image_repository}", "--set", f"image.tag={image_tag}",
                          *extra], capture_output=True, text=True, timeout=120, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def pod_template(objects: list[dict[str, Any]]) -> PodTemplate:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    (sts,) = by_kind["StatefulSet"]
    spec = sts["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    secrets = {s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()}
               for s in by_kind.get("Secret", [])}
    configmaps = {c["metadata"]["name"]: c["data"] for c in by_kind["ConfigMap"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config_mount, config_files, tmp_mounts = "", {}, []
    for mount in container["volumeMounts"]:
        volume = volumes.get(mount["name"])
        if volume is None:
            continue  # the volumeClaimTemplate's data volume: the image's VOLUME
        if "configMap" in volume:
            config_mount, config_files = mount["mountPath"], configmaps[volume["configMap"]["name"]]
        elif "emptyDir" in volume:
            tmp_mounts.append(mount["mountPath"])
    pod_sec, sec = spec.get("securityContext", {}), container.get("securityContext", {})
    grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    namespace = sts["metadata"].get("namespace", NAMESPACE)
    domain_suffix = next(str(v["value"]) for v in container["env"] if v["name"] == "RAFTBROKER_GRPC_ADDRESS")
    domain = domain_suffix.removeprefix("$(POD_NAME).").rpartition(":")[0]
    assert domain.startswith(f"{sts['spec']['serviceName']}.{namespace}.svc."), domain
    return PodTemplate(
        statefulset=sts["metadata"]["name"], replicas=int(sts["spec"]["replicas"]), domain=domain,
        command=container.get("command"), args=[str(a) for a in container.get("args", [])],
        env=container.get("env", []), secrets=secrets, config_files=config_files, config_mount=config_mount,
        user=f"{pod_sec.get('runAsUser', 0)}:{pod_sec.get('runAsGroup', 0)}",
        read_only_root=bool(sec.get("readOnlyRootFilesystem")), grpc_port=int(grpc_port), tmp_mounts=tmp_mounts)
