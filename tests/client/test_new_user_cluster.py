"""Defects a new user hits first (issue 13), through the SDK against a real 3-node cluster:
filters with groups are refused (never ignored), the README's Python example runs twice,
``create_topic(exist_ok=True)``, and one name for a topic's schema."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from broker.client import Client, InvalidArgument, TopicExists, TopicNotFound
from broker.devcluster import DevCluster
from broker.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from tests.cli.helpers import cli, json_lines

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
MODES = {"queue": common_pb2.DELIVERY_MODE_QUEUE, "stream": common_pb2.DELIVERY_MODE_STREAM}


@pytest.fixture(scope="module")
def client(cluster: DevCluster) -> Iterator[Client]:
    cluster.wait_ready()
    with Client(cluster.addresses) as c:
        yield c


def _leader_address(client: Client) -> str:
    leader = client.cluster_status().leader
    assert leader is not None and leader.grpc_address
    return leader.grpc_address


@pytest.mark.parametrize("mode", ["queue", "stream"])
def test_a_filter_on_a_group_subscription_is_refused_everywhere_and_changes_nothing(
        client: Client, cluster: DevCluster, mode: str) -> None:
    topic, group = f"evts-{mode}", f"gf-{mode}"
    client.create_topic(topic, partitions=2)
    client.publish_batch(topic, [f'{{"n": {i}}}'.encode() for i in range(6)])
    # the SDK refuses before sending, in both group entry points
    with pytest.raises(InvalidArgument, match="cannot take a filter"):
        client.subscribe(topic, group=group, mode=mode, filter="false", stop_at_end=True)
    with pytest.raises(InvalidArgument, match="cannot take a filter"):
        client.run(topic, group=group, mode=mode, filter="false", stop_at_end=True, handler=lambda m: None)
    # the server refuses the same request from any other client
    request = broker_pb2.SubscribeRequest(topic=topic, group=group, filter="false", stop_at_end=True,
                                          member_id="m1", group_config=common_pb2.GroupConfig(mode=MODES[mode]))
    with grpc.insecure_channel(_leader_address(client)) as channel, pytest.raises(grpc.RpcError) as raised:
        list(broker_pb2_grpc.BrokerStub(channel).Subscribe(request, timeout=30))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot take a filter" in (raised.value.details() or "")
    # the CLI refuses the combination (usage error) before connecting
    result = cli(",".join(cluster.addresses), "consume", topic, "--group", group, "--filter", "false", expect=2)
    assert "cannot filter" in result.output
    # nothing was created, acknowledged or committed: the group does not exist, a plain member gets all 6
    with pytest.raises(TopicNotFound, match="does not exist"):
        client.groups.describe(topic, group)
    got = json_lines(cli(",".join(cluster.addresses), "consume", topic, "--group", group, "--mode", mode, "--json"))
    assert sorted(json.loads(r["value"])["n"] for r in got) == list(range(6))


def _readme_python_example() -> str:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 1, "the README has one Python example"
    return blocks[0]


def test_the_readme_python_example_runs_twice_against_the_same_cluster(cluster: DevCluster) -> None:
    example = _readme_python_example().replace(
        '["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]', repr(list(cluster.addresses)))
    assert repr(list(cluster.addresses)) in example, "the example connects to the dev cluster's addresses"
    for run in (1, 2):
        namespace: dict[str, object] = {"__name__": f"readme_example_{run}"}
        exec(compile(example, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code


def test_create_topic_exist_ok_returns_the_existing_topic_and_still_checks_the_config(client: Client) -> None:
    first = client.create_topic("exist-ok", partitions=2)
    again = client.create_topic("exist-ok", partitions=2, exist_ok=True)
    assert again.incarnation == first.incarnation and again.partition_count == 2
    with pytest.raises(TopicExists):
        client.create_topic("exist-ok", partitions=2)
    with pytest.raises(TopicExists, match="partitions"):
        client.create_topic("exist-ok", partitions=3, exist_ok=True)


def test_the_schema_has_one_name_in_the_sdk_and_in_cli_json(client: Client, cluster: DevCluster) -> None:
    schema = {"type": "object", "properties": {"url": {"type": "string"}}}
    info = client.create_topic("named-schema", schema=schema)
    described = json.loads(cli(",".join(cluster.addresses), "topic", "describe", "named-schema", "--json").stdout)
    listed = json.loads(cli(",".join(cluster.addresses), "topic", "list", "--json").stdout)
    assert json.loads(info.schema_json) == schema
    assert json.loads(described["schema_json"]) == schema and "schema" not in described
    assert any(t["name"] == "named-schema" and "schema_json" in t for t in listed)
