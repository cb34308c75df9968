"""Fixtures of the CLI tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from broker.devcluster import DevCluster


@pytest.fixture(scope="module")
def bootstrap(cluster: DevCluster) -> Iterator[str]:
    """The module's cluster as a --bootstrap value, once it has a leader."""
    cluster.wait_ready()
    yield ",".join(cluster.addresses)
