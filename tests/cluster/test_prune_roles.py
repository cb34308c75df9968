"""Prune by a lead group, held back by a protecting group, and SKIP_FORWARD for a group behind a
prune across a leader kill, on a real 3-node cluster through the SDK (SPEC §2.2, §3.3)."""

from __future__ import annotations

import pytest

from broker.client import Client, Event, FailedPrecondition, GroupNotFound, InvalidArgument, Message
from broker.devcluster import DevCluster
from tests.cluster.digests import partition_contents, wait_converged
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


def starts(client: Client, topic: str) -> list[int]:
    return [p.start_offset for p in client.describe_topic(topic).partitions]


def commit_to(client: Client, topic: str, group: str, offset: int, partitions: int) -> None:
    for p in range(partitions):
        client.groups.seek(topic, group, offset, partition=p)


def test_a_lead_group_prunes_what_it_committed_unless_a_protecting_group_needs_it(killable: DevCluster) -> None:
    with Client(killable.addresses, retry_deadline_s=30) as client:
        client.create_topic("archive", 2)
        client.publish_batch("archive", [{"value": b"r%03d" % i, "partition": i % 2} for i in range(100)])
        client.groups.create("archive", "archiver")
        client.groups.create("archive", "audit")
        commit_to(client, "archive", "archiver", 30, 2)
        commit_to(client, "archive", "audit", 10, 2)

        with pytest.raises(FailedPrecondition, match="not marked lead"):
            client.prune("archive", group="archiver")
        assert client.groups.mark("archive", "archiver", "lead").prune_role == "lead"
        assert client.groups.mark("archive", "audit", "protect").prune_role == "protect"
        assert {g.group: g.prune_role for g in client.groups.list("archive")} == {"archiver": "lead",
                                                                                 "audit": "protect"}

        with pytest.raises(FailedPrecondition, match="group 'audit' protects partition 0 from offset 10"):
            client.prune("archive", group="archiver")
        with pytest.raises(FailedPrecondition, match="audit"):
            client.prune("archive", 20)
        with pytest.raises(FailedPrecondition, match="clear of topic 'archive' refused"):
            client.clear_topic("archive")
        assert starts(client, "archive") == [0, 0], "a refused prune deletes nothing"
        wait_converged(killable)  # refused at apply on every node alike: each still holds every record
        for address in killable.addresses:
            assert [o for o, _ in partition_contents(address, "archive", 0)] == list(range(50))

        assert client.prune("archive", 10) == 20, "up to the protecting group's position is allowed"
        commit_to(client, "archive", "audit", 40, 2)
        assert client.prune("archive", group="archiver") == 40
        assert starts(client, "archive") == [30, 30], "no further than the lead group committed"
        assert client.prune("archive", 25, group="archiver") == 0, "an offset bounds it further"

        client.groups.mark("archive", "audit", "none")
        with pytest.raises(InvalidArgument, match=r"before_offset 51 is past the end of partition 0 \(50\) \(and 1 "
                                                  r"other partition\(s\)\).*nothing was pruned"):
            client.prune("archive", 51)
        assert starts(client, "archive") == [30, 30], "a bound past the end deletes nothing"
        assert client.prune("archive", 45) == 30
        with pytest.raises(GroupNotFound):
            client.groups.mark("archive", "nobody", "lead")
        with pytest.raises(GroupNotFound):
            client.prune("archive", group="nobody")
        with pytest.raises(InvalidArgument):
            client.groups.mark("archive", "audit", "boss")
        assert starts(client, "archive") == [45, 45]


def test_a_group_behind_a_prune_gets_skip_forward_after_a_leader_kill(killable: DevCluster) -> None:
    with Client(killable.addresses, retry_deadline_s=60) as client:
        client.create_topic("gskip", 1)
        client.publish_batch("gskip", [b"v%02d" % i for i in range(20)])
        client.groups.create("gskip", "slow")
        assert client.prune("gskip", 12) == 12
        old = killable.leader()
        assert old is not None
        killable.kill(old)
        wait_until(lambda: killable.leader() not in (None, old), 30, "a new leader")
        try:
            items: list[Message | Event] = []
            with client.subscribe("gskip", group="slow", stop_at_end=True) as consumer:
                for item in consumer:
                    items.append(item)
                    if isinstance(item, Message):
                        item.ack()
            event = items[0]
            assert isinstance(event, Event) and event.type == "skip_forward"
            assert (event.offset_before, event.offset_after) == (0, 12)
            assert [m.value for m in items[1:] if isinstance(m, Message)] == [b"v%02d" % i for i in range(12, 20)]
            assert client.groups.lag("gskip", "slow").partitions[0].committed == 20
        finally:
            killable.spawn(old)
            killable.wait_ready(60)

