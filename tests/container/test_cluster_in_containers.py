"""The container tier (issue 17 item 5): three containers of the image on a user-defined network, each
run with the command, arguments, environment, config file, user and read-only root filesystem that
``helm template`` renders for the chart's StatefulSet pods (tests/container/chart.py reads them from
the rendered manifest). The Python SDK publishes and consumes from a client container on the same
network (the nodes advertise their pod DNS names, which resolve there as they do in a Kubernetes
cluster). Faults: the leader's container is killed (SIGKILL) and started again, the next leader's
container is paused and resumed, and the last leader is stopped gracefully (SIGTERM: it must hand
leadership over first) and started again. Nothing acknowledged is lost or duplicated, every node
converges to the same log, and the image's HEALTHCHECK (``raftbroker health``) reports every
container healthy again."""

from __future__ import annotations

import contextlib
import json
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

from tests.conftest import wait_until
from tests.container.chart import PodTemplate, pod_template, render

pytestmark = [pytest.mark.container, pytest.mark.timeout(1200)]

HERE = Path(__file__).resolve().parent
TOPIC = "containers"
BATCH = 60
READY_S = 240.0
STOP_TIMEOUT_S = 30


class PodContainers:
    """The StatefulSet's pods as containers, plus one client container for the SDK."""

    def __init__(self, tpl: PodTemplate, image: str, network: Network, config_dir: Path) -> None:
        self.tpl, self.image, self.network, self.config_dir = tpl, image, network, config_dir
        self.pods: list[DockerContainer] = []
        self.client: DockerContainer | None = None

    def start(self) -> None:
        self.config_dir.chmod(0o755)  # as the kubelet mounts a ConfigMap: readable by the pod's user
        for name, text in self.tpl.config_files.items():
            (self.config_dir / name).write_text(text)
            (self.config_dir / name).chmod(0o644)
        for i in range(self.tpl.replicas):
            pod = DockerContainer(
                self.image, command=shlex.join(self.tpl.args), env=self.tpl.environment(i), network=self.network,
                network_aliases=[self.tpl.fqdn(i)], hostname=self.tpl.pod_name(i), domainname=self.tpl.domain,
                user=self.tpl.user, read_only=self.tpl.read_only_root,
                volumes=[(str(self.config_dir), self.tpl.config_mount, "ro")])
            for path in self.tpl.tmp_mounts:
                pod.with_tmpfs_mount(path, "size=64m")
            self.pods.append(pod)
            pod.start()
        self.client = DockerContainer(self.image, entrypoint=["sleep", "infinity"], network=self.network,
                                      healthcheck={"test": ["NONE"]},
                                      user=self.tpl.user, volumes=[(str(HERE), "/client", "ro")])
        self.client.start()

    def stop(self) -> None:
        for c in [*self.pods, *([self.client] if self.client else [])]:
            container = c._container  # None when it never started
            if container is not None:
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True, v=True)

    def wrapped(self, i: int) -> Any:
        return self.pods[i].get_wrapped_container()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.tpl.fqdn(i)}:{self.tpl.grpc_port}" for i in range(self.tpl.replicas))

    def sdk(self, *args: str, bootstrap: str | None = None) -> dict[str, Any]:
        assert self.client is not None
        code, (out, err) = self.client.get_wrapped_container().exec_run(
            ["python3", "/client/client_script.py", bootstrap or self.bootstrap, *args], demux=True)
        assert code == 0, f"client {args} exited {code}: {(err or b'').decode()[-3000:]}"
        return dict(json.loads(out.decode().strip().splitlines()[-1]))

    def health(self, i: int) -> str:
        c = self.wrapped(i)
        c.reload()
        return str(c.attrs["State"].get("Health", {}).get("Status", "none"))

    def all_healthy(self) -> bool:
        return all(self.health(i) == "healthy" for i in range(self.tpl.replicas))

    def leader(self) -> int:
        status = self.sdk("status")
        leader_id = status["leader_id"]
        assert leader_id, status
        return int(leader_id.rpartition("-")[2])

    def converged(self) -> bool:
        nodes = self.sdk("status")["nodes"]
        if len(nodes) != self.tpl.replicas or not all(n["reachable"] for n in nodes):
            return False
        return len({n["applied_index"] for n in nodes}) == 1 and len({n["commit_index"] for n in nodes}) == 1


@pytest.fixture
def pods(engine: docker.DockerClient, image: str, helm: str, tmp_path: Path) -> Iterator[PodContainers]:
    repository, _, tag = image.rpartition(":")
    tpl = pod_template(render(helm, repository, tag))
    assert tpl.replicas == 3 and tpl.read_only_root and tpl.user == "10001:10001", tpl
    with Network() as network:
        cluster = PodContainers(tpl, image, network, tmp_path)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()


def publish(pods: PodContainers, first: int, acked: list[str]) -> None:
    result = pods.sdk("publish", TOPIC, str(first), str(BATCH))
    acked.extend(result["acked"])
    print(f"published {first}..{first + BATCH - 1}: {len(result['acked'])} acked, {len(result['failed'])} not")


def test_three_containers_survive_kill_pause_and_graceful_stop(pods: PodContainers) -> None:
    started = time.monotonic()
    wait_until(pods.all_healthy, READY_S, "every container healthy (docker HEALTHCHECK: raftbroker health)", 1.0)
    print(f"cluster of containers healthy after {time.monotonic() - started:.1f} s")
    acked: list[str] = []
    publish(pods, 0, acked)

    killed = pods.leader()  # kill -9 the leader's container; a new leader is elected; restart it
    pods.wrapped(killed).kill()
    publish(pods, BATCH, acked)
    pods.wrapped(killed).start()
    wait_until(pods.all_healthy, READY_S, "every container healthy after the restart", 1.0)

    paused = pods.leader()  # freeze the next leader's container; the other two go on; resume it
    pods.wrapped(paused).pause()
    publish(pods, 2 * BATCH, acked)
    pods.wrapped(paused).unpause()
    wait_until(pods.all_healthy, READY_S, "every container healthy after the pause", 1.0)

    stopped = pods.leader()  # SIGTERM: the leader hands over before it exits; then start it again
    pods.wrapped(stopped).stop(timeout=STOP_TIMEOUT_S)
    logs = pods.wrapped(stopped).logs().decode()
    assert "handed leadership over (now follower)" in logs, logs[-3000:]
    assert "allocator: jemalloc (/usr/lib/" in logs, logs[:3000]  # the image's libjemalloc2, preloaded
    publish(pods, 3 * BATCH, acked)
    pods.wrapped(stopped).start()
    wait_until(pods.all_healthy, READY_S, "every container healthy after the graceful stop", 1.0)
    wait_until(pods.converged, READY_S, "every node at the same commit and applied index", 1.0)

    assert len(acked) >= 3 * BATCH, f"only {len(acked)} of {4 * BATCH} publishes were acknowledged"
    for i in range(pods.tpl.replicas):  # each node's own copy of the log
        values = pods.sdk("consume", TOPIC, bootstrap=f"{pods.tpl.fqdn(i)}:{pods.tpl.grpc_port}")["values"]
        assert len(values) == len(set(values)), f"node {i}: duplicates in {values}"
        missing = [v for v in acked if v not in values]
        assert not missing, f"node {i} lost acknowledged records {missing}"
        order = [v for v in values if v in set(acked)]
        assert order == acked, f"node {i}: acknowledged records out of order"
