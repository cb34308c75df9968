"""Installs what the benchmark needs when it is missing: the peers from Debian packages, their Python
clients from PyPI (the ``bench`` extra of pyproject.toml). Raises :class:`InstallFailed` with the reason."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# system name prefix -> (Debian package, the file that proves it is installed)
PEER_PACKAGES = {
    "nats": ("nats-server", "/usr/bin/nats-server"),
    "redis": ("redis-server", "/usr/bin/redis-server"),
    "rabbitmq": ("rabbitmq-server", "/usr/lib/rabbitmq/bin/rabbitmq-server"),
}
PYTHON_MODULES = ("nats", "aio_pika", "redis", "hdrh", "matplotlib")


class InstallFailed(RuntimeError):
    """A dependency is missing and could not be installed."""


def missing_packages(systems: Iterable[str]) -> list[str]:
    """Debian packages the given systems need that are not installed."""
    wanted = {PEER_PACKAGES[prefix] for name in systems for prefix in PEER_PACKAGES if name.startswith(prefix)}
    # Debian 12 installs nats-server in /usr/sbin: a binary of the proof's name on PATH counts too.
    return sorted(pkg for pkg, proof in wanted if not Path(proof).exists() and shutil.which(Path(proof).name) is None)


def _run(argv: list[str]) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise InstallFailed(f"{' '.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout)[-1500:]}")


def ensure_peers(systems: Iterable[str]) -> list[str]:
    """apt-get install the missing peer packages; return what was installed."""
    missing = missing_packages(systems)
    if not missing:
        return []
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise InstallFailed(f"missing {', '.join(missing)}: install them (apt-get install {' '.join(missing)}) "
                            "or run as root on Debian")
    _run(["apt-get", "update", "-q"])
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing])
    return missing


def missing_modules() -> list[str]:
    return [m for m in PYTHON_MODULES if importlib.util.find_spec(m) is None]


def ensure_python_clients() -> list[str]:
    """pip install the ``bench`` extra into this interpreter when a client module is missing."""
    missing = missing_modules()
    if missing:
        _run([sys.executable, "-m", "pip", "install", "-q", "-e", f"{REPO}[bench]"])
        importlib.invalidate_caches()
        still = missing_modules()
        if still:
            raise InstallFailed(f"still missing after pip install: {', '.join(still)}")
    return missing
