"""Fixtures of the container tier: a Docker engine (``make test`` starts one with deploy/dockerd.sh
and exports DOCKER_HOST), the image (built once by deploy/build-image.sh unless RAFTBROKER_IMAGE
names one already built), and helm (installed by ``make helm-lint``). A missing prerequisite fails
the tier with the reason; it never skips silently."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

# testcontainers' reaper (ryuk) is an image from a registry, which this machine cannot reach;
# every container and network is removed by the fixtures' teardown instead.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

import docker  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 1200


@pytest.fixture(scope="session")
def engine() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 (any failure to reach the engine means the same)
        pytest.fail(f"container tier: no Docker engine answers (DOCKER_HOST={os.environ.get('DOCKER_HOST')!r}): "
                    f"{exc}; run deploy/dockerd.sh (as `make test` does) and export the DOCKER_HOST it prints")
    yield client
    client.close()


@pytest.fixture(scope="session")
def image(engine: docker.DockerClient) -> str:
    """The image's tag: RAFTBROKER_IMAGE when set (built already), else built now."""
    preset = os.environ.get("RAFTBROKER_IMAGE")
    if preset:
        engine.images.get(preset)  # fails clearly if it is not there
        return preset
    proc = subprocess.run([str(REPO / "deploy" / "build-image.sh")], cwd=REPO, capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"deploy/build-image.sh failed:\n{proc.stderr[-4000:]}"
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def helm() -> str:
    path = os.environ.get("RAFTBROKER_HELM", str(REPO / ".venv" / "tools" / "helm"))
    if not Path(path).exists():
        pytest.fail(f"container tier: no helm at {path}: run `make helm-lint` (it installs helm) "
                    "or set RAFTBROKER_HELM")
    return path
