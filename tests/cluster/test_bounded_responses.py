"""Every stream response is bounded in bytes (issue 11 item 6, issue 13 item 1): a backlog of
mixed record sizes, 1 B up to the record limit, read from offset 0 by the SDK, the CLI, a queue
group, a stream group, a route and an ephemeral reader. (Before the bound, a default read built one
response of up to 500 records and failed with RESOURCE_EXHAUSTED past the 9 MiB message limit.)"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from broker.client import Client, Message, Record
from broker.devcluster import DevCluster
from tests.cli.helpers import cli, json_lines
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

RECORD_LIMIT_BYTES = 1 << 20
NEAR_LIMIT_BYTES = RECORD_LIMIT_BYTES - 256  # with its framing and origin the stored body is just under the limit
PUBLISH_BATCH_BYTES = 6 << 20  # under the 8 MiB batch limit


def mixed_values(seed: int = 11) -> list[bytes]:
    """About 15 MB: a few records at the limit, hundreds of 20 KB, some of 250 KB, many tiny ones
    (1 B and up), shuffled with a fixed seed; each value is unique (its index leads it)."""
    sizes = [NEAR_LIMIT_BYTES] * 4 + [20_000] * 300 + [250_000] * 20 + [1] * 10 + list(range(2, 92))
    rng = random.Random(seed)
    rng.shuffle(sizes)
    sizes.insert(1, NEAR_LIMIT_BYTES)  # the first few records already pass any count-only bound
    values = []
    for i, size in enumerate(sizes):
        head = b"%d:" % i
        values.append(head[:size] + b"x" * max(0, size - len(head)))
    return values


def publish_all(client: Client, topic: str, values: list[bytes]) -> None:
    batch: list[bytes] = []
    size = 0
    for value in values:
        if batch and size + len(value) > PUBLISH_BATCH_BYTES:
            client.publish_batch(topic, batch)
            batch, size = [], 0
        batch.append(value)
        size += len(value)
    if batch:
        client.publish_batch(topic, batch)


def read_all(client: Client, topic: str, **options: int) -> list[bytes]:
    return [r.value for r in client.subscribe(topic, group=None, stop_at_end=True, **options)
            if isinstance(r, Record)]


def drain_group(client: Client, topic: str, group: str, mode: str, expected: int) -> list[bytes]:
    """Every record of ``topic`` through a fresh group member, acked one by one, in offset order
    (with room for the whole backlog in flight, so one round leases all of it)."""
    got: dict[int, bytes] = {}
    with client.subscribe(topic, group=group, mode=mode, stop_at_end=True, max_in_flight=1000) as consumer:
        for item in consumer:
            if isinstance(item, Message):
                got[item.offset] = item.value
                item.ack()
            if len(got) == expected:
                break
    return [got[o] for o in sorted(got)]


@pytest.fixture(scope="module")
def mixed(cluster: DevCluster) -> Iterator[tuple[Client, list[bytes]]]:
    values = mixed_values()
    with Client(cluster.addresses, retry_deadline_s=60) as client:
        client.create_topic("mixed")
        publish_all(client, "mixed", values)
        yield client, values


def test_sdk_reads_a_mixed_size_backlog_from_offset_zero_and_from_the_middle(
        mixed: tuple[Client, list[bytes]]) -> None:
    client, values = mixed
    assert read_all(client, "mixed") == values
    assert read_all(client, "mixed", start=100) == values[100:]
    assert read_all(client, "mixed", max_batch=10_000) == values  # the largest count bound is still safe


def test_cli_consumes_a_mixed_size_backlog(mixed: tuple[Client, list[bytes]], cluster: DevCluster) -> None:
    _, values = mixed
    bootstrap = ",".join(cluster.addresses)
    first = json_lines(cli(bootstrap, "--json", "consume", "mixed", "--limit", "3"))
    assert [r["value"].encode() for r in first] == values[:3]
    everything = json_lines(cli(bootstrap, "--json", "consume", "mixed"))
    assert [r["value"].encode() for r in everything] == values


@pytest.mark.parametrize("mode", ["queue", "stream"])
def test_groups_deliver_a_mixed_size_backlog(mixed: tuple[Client, list[bytes]], mode: str) -> None:
    client, values = mixed
    assert drain_group(client, "mixed", f"g-{mode}", mode, len(values)) == values


def test_a_route_copies_a_mixed_size_backlog(mixed: tuple[Client, list[bytes]]) -> None:
    client, values = mixed
    client.create_topic("mixed-copy")
    client.create_route("copy-mixed", "mixed", "mixed-copy")
    wait_until(lambda: len(read_all(client, "mixed-copy")) >= len(values), 300, "the route to copy the backlog",
               interval_s=1.0)
    assert read_all(client, "mixed-copy") == values


def test_an_ephemeral_reader_gets_a_mixed_size_backlog(mixed: tuple[Client, list[bytes]]) -> None:
    client, values = mixed
    client.create_topic("mixed-live", durability="ephemeral")
    publish_all(client, "mixed-live", values)
    assert read_all(client, "mixed-live") == values


def test_dead_letters_of_large_records_list_under_the_message_limit(mixed: tuple[Client, list[bytes]]) -> None:
    """Twelve dead letters of ~1 MiB: one listing (it would be ~12 MiB with every copy) answers, the
    first ones carry their record, every one points at its copy in the DLQ topic."""
    client, _ = mixed
    big = [b"%d:" % i + b"d" * (NEAR_LIMIT_BYTES - 8) for i in range(12)]
    client.create_topic("bigdead")
    publish_all(client, "bigdead", big)
    discarded = 0
    with client.subscribe("bigdead", group="dlq", mode="queue", stop_at_end=True, max_in_flight=20) as consumer:
        for item in consumer:
            if isinstance(item, Message):
                item.discard("too big to handle")
                discarded += 1
            if discarded == len(big):
                break
    dead = wait_until(lambda: (d := client.groups.dead_letters("bigdead", "dlq", limit=100)) and len(d) == len(big)
                      and d, 60, "every discarded record to be a dead letter")
    assert isinstance(dead, list)
    with_record = [d for d in dead if d.record is not None]
    assert 1 <= len(with_record) < len(big)
    assert [d.record.value for d in with_record] == big[:len(with_record)]
    copies = read_all(client, "bigdead.dlq.dlq")
    assert [copies[d.dlq_offset] for d in dead] == big
