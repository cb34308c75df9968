"""The HTTP fuzz tier: schemathesis generates requests from the OpenAPI document a real node serves
(``GET /openapi.json`` of a 3-node cluster's gateway) and sends them with a real HTTP client.

After every request: no 5xx (the gateway answers every input with a fitting status, never a
crash or an INTERNAL), an error is ``application/problem+json``, and a refused request (4xx)
changed nothing in the cluster (topics with their configs and end offsets, read over gRPC).
Seeded and bounded: ``RAFTBROKER_FUZZ_EXAMPLES`` (default 400; divided among the operations) and
``RAFTBROKER_FUZZ_SEED``. The SSE watch is left out (a valid one never ends by design); its
validation shares the read endpoint's parameters and is tested in tests/http.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis.core.result import Err, Ok

from broker.client import Client
from broker.devcluster import DevCluster
from tests.http.conftest import start_http_cluster

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(3600)]

EXAMPLES = int(os.environ.get("RAFTBROKER_FUZZ_EXAMPLES", "400"))
SEED = int(os.environ.get("RAFTBROKER_FUZZ_SEED", "20261124"))
PER_OPERATION = max(5, EXAMPLES // 20)
TOPICS = ("orders", "fz2")  # "orders": the example topic name of the served document


@pytest.fixture(scope="module")
def fuzz_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    c = start_http_cluster(Path(tmp_path_factory.mktemp("http-fuzz")))
    try:
        with Client(c.addresses) as client:
            for name in TOPICS:
                client.create_topic(name, 2)
                client.publish_batch(name, [f"r{i}" for i in range(10)])
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def sync_client(fuzz_cluster: DevCluster) -> Iterator[Client]:
    with Client(fuzz_cluster.addresses) as client:
        yield client


@pytest.fixture(scope="module")
def served_schema(fuzz_cluster: DevCluster) -> schemathesis.BaseSchema:
    base = f"http://{fuzz_cluster.http_address(1)}"  # a node that may be a follower: writes are forwarded
    return schemathesis.openapi.from_url(f"{base}/openapi.json").exclude(path_regex="/watch$")


def digest(client: Client) -> list[tuple[object, ...]]:
    return [(t.name, t.partition_count, t.durability, t.full_policy, t.dedup_window_ms, t.retention, t.incarnation,
             tuple(p.end_offset for p in client.describe_topic(t.name).partitions)) for t in client.list_topics()]


def test_generated_http_requests(served_schema: schemathesis.BaseSchema, sync_client: Client) -> None:
    """Every operation of the served document (schemathesis's pytest plugin does not run under this
    pytest, so each operation's case strategy is driven by hypothesis directly)."""
    results = list(served_schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), [result.err() for result in results if isinstance(result, Err)]
    statuses: Counter[int] = Counter()
    assert len(operations) >= 15, [op.label for op in operations]
    for operation in operations:

        @seed(SEED)
        @settings(max_examples=PER_OPERATION, deadline=None, phases=[Phase.explicit, Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None)
        @given(case=operation.as_strategy())
        def one(case: schemathesis.Case) -> None:
            before = digest(sync_client)
            response = case.call(timeout=60)
            what = f"{case.method} {case.formatted_path}"
            statuses[response.status_code // 100] += 1
            assert response.status_code < 500, f"{what}: {response.status_code} {response.text}"
            if response.status_code >= 400:
                assert response.headers.get("content-type") == ["application/problem+json"], f"{what}: {response.text}"
                assert digest(sync_client) == before, f"{what}: a refused request changed the cluster: {response.text}"

        one()
    print(f"HTTP fuzz: responses by class {dict(statuses)}")
    assert statuses[2] and statuses[4], f"the generated requests should reach both outcomes: {dict(statuses)}"
