"""The wheel built from a plain checkout installs and works on its own (no ``make proto``, no checkout).

The checkout is copied first (the files git tracks or would track: what a fresh clone has), so
the gRPC stubs generated in this worktree by ``make proto`` cannot leak into the wheel: the stubs
must come from the build hook (setup.py). The wheel is installed with its dependencies in a fresh
venv and used from a directory outside the repository: imports, ``raftbroker --version``, and one
real node started from the installed ``raftbroker serve``, written to and read from with the
installed SDK.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.devcluster import METRICS_PORT_OFFSET, RAFT_PORT_OFFSET, free_base_port
from broker.v1 import admin_pb2, admin_pb2_grpc
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 600
STEP_TIMEOUT_S = 120
STOP_TIMEOUT_S = 10


def _project_version() -> str:
    with open(REPO / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _run(cmd: list[str], cwd: Path, timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; fail the test with its output when it exits non-zero."""
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def _clean_env() -> dict[str, str]:
    """The environment without this venv's traces (the installed venv must stand on its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _copy_checkout(dest: Path) -> Path:
    """Copy the files of the checkout that git tracks or would track (no ignored file: no stubs)."""
    listing = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], REPO, 60)
    for rel in filter(None, listing.split("\0")):
        src = REPO / rel
        if src.is_file():  # deleted but still tracked: skip
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    assert not list((dest / "broker" / "v1").glob("*_pb2*.py")), "the copy must not carry generated stubs"
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The checkout copy, its wheel and its sdist."""
    root = tmp_path_factory.mktemp("packaging")
    src = _copy_checkout(root / "src")
    dist = root / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(src)], root, BUILD_TIMEOUT_S,
         _clean_env())
    wheels = list(dist.glob("raftbroker-*.whl"))
    assert len(wheels) == 1, wheels
    sdist_dir = root / "sdist"
    sdist_dir.mkdir()
    name = _run([sys.executable, "-c", f"from setuptools.build_meta import build_sdist; "
                 f"print(build_sdist({str(sdist_dir)!r}))"], src, STEP_TIMEOUT_S).strip().splitlines()[-1]
    return {"root": root, "src": src, "wheel": wheels[0], "sdist": sdist_dir / name}


@pytest.fixture(scope="module")
def venv(built: dict[str, Path]) -> Path:
    """A fresh venv with the wheel installed (dependencies from the package index)."""
    env_dir = built["root"] / "venv"
    _run([sys.executable, "-m", "venv", str(env_dir)], built["root"], STEP_TIMEOUT_S, _clean_env())
    _run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q",
          str(built["wheel"])], built["root"], BUILD_TIMEOUT_S, _clean_env())
    return env_dir


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory outside the repository (the checkout must not be importable)."""
    d = tmp_path / "outside"
    d.mkdir()
    return d


def test_wheel_contains_the_stubs_and_no_tests(built: dict[str, Path]) -> None:
    names = zipfile.ZipFile(built["wheel"]).namelist()
    for stub in ("broker_pb2.py", "broker_pb2_grpc.py", "admin_pb2.py", "internal_pb2.py", "common_pb2.pyi"):
        assert f"broker/v1/{stub}" in names, f"{stub} missing from the wheel"
    top = {n.split("/")[0] for n in names}
    assert top == {"broker", f"raftbroker-{_project_version()}.dist-info"}, top  # no tests/, chaos/, bench/
    assert not [n for n in names if "/tests/" in n or n.startswith(("tests/", "chaos/"))]
    assert not (built["src"] / "broker" / "v1" / "broker_pb2.py").exists(), "the build wrote into the source tree"


def test_sdist_carries_the_protos(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("setup.py", "pyproject.toml", "proto/broker/v1/broker.proto", "proto/broker/v1/common.proto"):
        assert needed in names, f"{needed} missing from the sdist"


def test_installed_wheel_imports_and_reports_its_version(venv: Path, outside: Path) -> None:
    python = str(venv / "bin" / "python")
    out = _run([python, "-c", "import broker, broker.client, broker.node, broker.v1.broker_pb2_grpc, broker.cli.main; "
                "print(broker.__file__)"], outside, STEP_TIMEOUT_S, _clean_env())
    assert Path(out.strip()).is_relative_to(venv), f"imported from {out.strip()}, not from the venv"
    version = _run([str(venv / "bin" / "raftbroker"), "--version"], outside, STEP_TIMEOUT_S, _clean_env())
    assert version == f"raftbroker {_project_version()}\n"
    # The drills need the repository's chaos package, which the wheel leaves out: a clear refusal, no traceback.
    drill = subprocess.run([str(venv / "bin" / "raftbroker"), "drill", "kill-leader"], cwd=outside, env=_clean_env(),
                           capture_output=True, text=True, timeout=STEP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert drill.returncode == 2, drill.stdout + drill.stderr
    assert "runs from a checkout of the repository" in drill.stderr and "Traceback" not in drill.stderr


SDK_ROUND_TRIP = """
import sys
from broker.client import Client
with Client(sys.argv[1], retry_deadline_s=60) as client:
    client.create_topic("wheel-check", exist_ok=True)
    result = client.publish("wheel-check", b"from the wheel")
    values = [r.value for r in client.subscribe("wheel-check", stop_at_end=True) if hasattr(r, "value")]
    print(result.offset, values)
"""


@pytest.fixture
def node(venv: Path, outside: Path) -> Iterator[str]:
    """One node started with the installed ``raftbroker serve``; killed by PID afterwards."""
    base = free_base_port(1)
    grpc_address = f"127.0.0.1:{base}"
    cmd = [str(venv / "bin" / "raftbroker"), "serve", "--node-id", "n1", "--data-dir", str(outside / "n1"),
           "--grpc", grpc_address, "--raft", f"127.0.0.1:{base + RAFT_PORT_OFFSET}",
           "--metrics", f"127.0.0.1:{base + METRICS_PORT_OFFSET}"]
    with open(outside / "n1.log", "ab") as log:
        proc = subprocess.Popen(cmd, cwd=outside, env=_clean_env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    channel = grpc.insecure_channel(grpc_address)
    try:
        def leader() -> bool:
            assert proc.poll() is None, (outside / "n1.log").read_text()[-4000:]
            try:
                info = admin_pb2_grpc.AdminStub(channel).NodeStatus(admin_pb2.NodeStatusRequest(), timeout=1.0)
            except grpc.RpcError:
                return False
            return bool(info.role == "leader")

        wait_until(leader, 60, "the node from the wheel to lead")
        yield grpc_address
    finally:
        channel.close()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT_S)


def test_node_and_sdk_from_the_installed_wheel(venv: Path, outside: Path, node: str) -> None:
    out = _run([str(venv / "bin" / "python"), "-c", SDK_ROUND_TRIP, node], outside, STEP_TIMEOUT_S, _clean_env())
    assert out == "0 [b'from the wheel']\n", out
