"""Requests a hostile caller sent through grpcurl and raw stubs (2026-12-07), each of which used to be
accepted, stored something it should not, or answered with the wrong status: each is now refused
before anything is replicated, with a status and a message naming what was wrong (SPEC §5, §9)."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import grpc
import pytest

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2, common_pb2, internal_pb2, routes_pb2, routes_pb2_grpc
from tests.cluster.stubs import Stubs, refused, stubs

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def leader(cluster: DevCluster) -> Iterator[Stubs]:
    s = stubs(cluster.wait_ready())
    s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="hostile")), timeout=30)
    s.broker.Publish(broker_pb2.PublishRequest(topic="hostile", records=[
        broker_pb2.PublishRecord(value=b"v%d" % i) for i in range(3)]), timeout=30)
    s.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="hostile", group="g"), timeout=30)
    yield s
    s.close()


def _records(s: Stubs, topic: str) -> list[common_pb2.Record]:
    request = broker_pb2.SubscribeRequest(topic=topic, stop_at_end=True)
    return [r for response in s.broker.Subscribe(request, timeout=30) for r in response.batch.records]


def _read_all(s: Stubs, request: broker_pb2.SubscribeRequest) -> list[broker_pb2.SubscribeResponse]:
    return list(s.broker.Subscribe(request, timeout=30))


def test_a_mirrored_body_cannot_forge_what_readers_are_told(leader: Stubs) -> None:
    """Stored bodies merge into delivered records by their bytes: a field RecordBody lacks (a
    Record's topic 1, offset 3, position 12, delivery attempt 13) reached every reader as sent."""
    leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(name="mirrored")), timeout=30)
    honest = internal_pb2.RecordBody(value=b"v", origin="other/x").SerializeToString()
    forged = honest + b"\x18\xbf\x84\x3d" + b"\x0a\x04fake" + b"\x62\x03abc\x68\x07"
    mirror = routes_pb2_grpc.MirrorStub(leader.channel)

    def append(body: bytes, key: str) -> routes_pb2.MirrorAppendResponse:
        return mirror.Append(routes_pb2.MirrorAppendRequest(topic="mirrored", records=[
            routes_pb2.MirrorRecord(body=body, idempotency_key=key)]), timeout=30)

    code, message = refused(lambda: append(forged, "k1"))
    assert code == INVALID and "record 0: body has fields a stored record does not (numbers [1, 3, 12, 13])" in message
    assert _records(leader, "mirrored") == []
    append(honest, "k2")
    (record,) = _records(leader, "mirrored")
    assert (record.topic, record.offset, record.value, record.origin) == ("mirrored", 0, b"v", "other/x")


def test_dead_letter_retries_are_bounded_and_checked_before_they_are_replicated(leader: Stubs) -> None:
    def retry(messages: list[tuple[int, int]], everything: bool = False) -> tuple[grpc.StatusCode, str]:
        return refused(lambda: leader.admin.RetryDeadLetters(admin_pb2.RetryDeadLettersRequest(
            topic="hostile", group="g", all=everything,
            messages=[admin_pb2.PartitionOffset(partition=p, offset=o) for p, o in messages]), timeout=60))

    # 400,000 named in one call used to be replicated as one command and moved the leadership
    assert retry([(0, i) for i in range(10_001)]) == (INVALID, "at most 10000 dead letters per call, got 10001")
    assert retry([(0, 1)], everything=True) == (INVALID, "give either all or the dead letters to retry, not both")
    assert retry([(99, 2**64 - 1)]) == (INVALID, "partition 99 does not exist (topic has 1)")
    answer = leader.admin.RetryDeadLetters(admin_pb2.RetryDeadLettersRequest(
        topic="hostile", group="g", messages=[admin_pb2.PartitionOffset(partition=0, offset=5)]), timeout=30)
    assert (answer.retried, answer.pruned) == (0, 0), "no such dead letter: ignored"


def test_a_member_id_is_bounded_and_printable(leader: Stubs) -> None:
    """Twelve members of 1 MB each made every DescribeGroup answer too large to send, for as long as
    their sessions lasted; a NUL went into logs and answers as it was."""
    config = common_pb2.GroupConfig(mode=common_pb2.DELIVERY_MODE_STREAM)
    def join(member: str) -> broker_pb2.JoinGroupResponse:
        return leader.broker.JoinGroup(broker_pb2.JoinGroupRequest(
            topic="hostile", group="members", member_id=member, group_config=config), timeout=30)

    for member in ("x" * 129, "a\x00b", "tab\there"):
        code, message = refused(functools.partial(join, member))
        assert code == INVALID and "use at most 128 printable characters" in message
    joined = join("worker-1")
    assert joined.member_id == "worker-1"
    code, _ = refused(lambda: leader.broker.Heartbeat(broker_pb2.HeartbeatRequest(
        topic="hostile", group="members", member_id="y" * 1000), timeout=30))
    assert code == INVALID


def test_a_group_start_is_checked_as_a_subscription_start_is(leader: Stubs) -> None:
    unknown = common_pb2.GroupConfig(start_from=common_pb2.Position(start=9))  # type: ignore[arg-type]
    assert refused(lambda: leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(
        topic="hostile", group="bad-start", config=unknown), timeout=30)) == (
        INVALID, "unknown start position 9 in start_from")
    garbage = common_pb2.GroupConfig(start_from=common_pb2.Position(token=b"junk"))
    code, _ = refused(lambda: leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(
        topic="hostile", group="bad-token", config=garbage), timeout=30))
    assert code == INVALID
    code, _ = refused(lambda: leader.admin.DescribeGroup(admin_pb2.DescribeGroupRequest(
        topic="hostile", group="bad-start"), timeout=30))
    assert code == grpc.StatusCode.NOT_FOUND, "nothing was created"


def test_fields_that_do_not_apply_are_refused_not_ignored(leader: Stubs) -> None:
    code, message = refused(lambda: leader.broker.Publish(broker_pb2.PublishRequest(
        topic="hostile", records=[broker_pb2.PublishRecord(value=b"x")], results=5), timeout=30))  # type: ignore[arg-type]
    assert code == INVALID and "unknown results form 5" in message
    for stray in (broker_pb2.SubscribeRequest(topic="hostile", member_id="zz", stop_at_end=True),
                  broker_pb2.SubscribeRequest(topic="hostile", max_in_flight=5, stop_at_end=True),
                  broker_pb2.SubscribeRequest(topic="hostile", stop_at_end=True,
                                              group_config=common_pb2.GroupConfig(mode=common_pb2.DELIVERY_MODE_STREAM))):
        code, message = refused(functools.partial(_read_all, leader, stray))
        assert code == INVALID and "belong to a group subscription" in message
    leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="hostile", group="s", config=common_pb2.GroupConfig(
        mode=common_pb2.DELIVERY_MODE_STREAM)), timeout=30)
    code, message = refused(lambda: leader.broker.Commit(broker_pb2.CommitRequest(
        topic="hostile", group="s", partition=0, offset=2**64 - 1), timeout=30))
    assert code == INVALID and "is past the end of partition 0 (3)" in message
    # a queue-mode group's records go to any member in any order: a commit would settle what others hold
    code, message = refused(lambda: leader.broker.Commit(broker_pb2.CommitRequest(
        topic="hostile", group="g", partition=0, offset=2), timeout=30))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "'g' is a queue-mode group" in message, message
    for group in ("s", "g"):
        lag = leader.admin.GroupLag(admin_pb2.GroupLagRequest(topic="hostile", group=group), timeout=30)
        assert lag.partitions[0].committed == 0, "the refused commit settled nothing"


def test_a_malformed_name_is_invalid_not_missing(leader: Stubs) -> None:
    calls = {
        "DeleteGroup": lambda: leader.admin.DeleteGroup(admin_pb2.DeleteGroupRequest(), timeout=30),
        "MarkGroup": lambda: leader.admin.MarkGroup(admin_pb2.MarkGroupRequest(), timeout=30),
        "PauseGroups": lambda: leader.admin.PauseGroups(admin_pb2.PauseGroupsRequest(), timeout=30),
        "ResumeGroups": lambda: leader.admin.ResumeGroups(admin_pb2.PauseGroupsRequest(topic="hostile",
                                                                                       group="no dots."), timeout=30),
        "Prune": lambda: leader.admin.Prune(admin_pb2.PruneRequest(topic="hostile", group="bad name"), timeout=30),
        "DeleteRoute": lambda: leader.admin.DeleteRoute(routes_pb2.DeleteRouteRequest(), timeout=30),
    }
    for name, call in calls.items():
        code, message = refused(call)
        assert code == INVALID and "invalid" in message, (name, code, message)


def test_a_topic_named_as_a_dead_letter_topic_that_refuses_records_is_not_taken_over(leader: Stubs) -> None:
    """Dead letters cannot be refused: such a topic used to fill past its own limits."""
    leader.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=admin_pb2.TopicConfig(
        name="hostile.strict.dlq", full_policy=common_pb2.FULL_POLICY_REJECT,
        retention=common_pb2.Retention(max_records=1))), timeout=30)
    code, message = refused(lambda: leader.admin.CreateGroup(admin_pb2.CreateGroupRequest(
        topic="hostile", group="strict"), timeout=30))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "its full policy is reject" in message


def test_a_group_of_a_topic_that_does_not_exist_says_the_topic_is_missing(leader: Stubs) -> None:
    code, message = refused(lambda: leader.admin.GroupLag(admin_pb2.GroupLagRequest(topic="never-made", group="g"),
                                                          timeout=30))
    assert code == grpc.StatusCode.NOT_FOUND and message == "topic 'never-made' does not exist"
