"""The asyncio examples in docs/examples run as documented against a real cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.devcluster import DevCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def run(example: str, c: DevCluster) -> str:
    done = subprocess.run([sys.executable, str(EXAMPLES / example), ",".join(c.addresses)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pubsub_example(cluster: DevCluster) -> None:
    out = run("aio_pubsub.py", cluster)
    assert out.count("read ") == 4 and "hello 3" in out
    assert "observed ['published', 'record']" in out


def test_worker_example(cluster: DevCluster) -> None:
    out = run("aio_worker.py", cluster)
    assert out.count("done job") == 8 and "handled 8 lag 0" in out
