"""Consumer-group contracts an audit found broken, through the SDK and the real gRPC API of a 3-node
cluster (SPEC §3.2, §5). Each test failed before its fix:

- a member that subscribed to a stream-mode group without restating ``mode`` never joined or beat:
  it was expired after the session timeout while its stream stayed open, and got nothing more;
- a stream-mode ``Commit`` settled the records but kept their leases until the visibility timeout
  (in_flight stayed up, a full member stalled, a handover waited);
- an ack, nack or discard with another topic's position token answered OK and did nothing;
- lag counted a retried record that is leased again both as in flight and as retrying.
"""

from __future__ import annotations

import time

import grpc
import pytest

from broker.client import Client, InvalidArgument, Message
from broker.devcluster import DevCluster
from broker.v1 import broker_pb2
from tests.cluster.stubs import refused, stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def members(client: Client, topic: str, group: str) -> dict[str, tuple[int, ...]]:
    return client.groups.describe(topic, group).members


def test_a_member_without_a_mode_joins_a_stream_mode_group_and_stays(client: Client) -> None:
    client.create_topic("c-stream", 2)
    client.groups.create("c-stream", "s", mode="stream", session_timeout_ms=1500)
    client.publish("c-stream", b"a", partition=0)
    with client.subscribe("c-stream", group="s") as consumer:
        first = next(consumer)
        assert isinstance(first, Message) and first.value == b"a"
        first.ack()
        assert consumer.stream_mode and members(client, "c-stream", "s") == {consumer.member_id: (0, 1)}
        time.sleep(2.5)  # past the session timeout: only heartbeats keep a member
        assert members(client, "c-stream", "s") == {consumer.member_id: (0, 1)}
        client.publish("c-stream", b"b", partition=1)
        second = next(consumer)
        assert isinstance(second, Message) and second.value == b"b"
        second.ack()
    # saying queue to a stream-mode group is refused rather than half-joined
    with pytest.raises(InvalidArgument, match="'s' is a stream-mode group"):
        next(client.subscribe("c-stream", group="s", mode="queue"))


def test_a_stream_mode_commit_releases_the_leases_it_settles(client: Client) -> None:
    client.create_topic("c-commit", 1)
    for i in range(6):
        client.publish("c-commit", b"v%d" % i)
    client.groups.create("c-commit", "s", mode="stream", visibility_timeout_ms=60_000)
    with client.subscribe("c-commit", group="s", max_in_flight=3) as consumer:
        got = [next(consumer) for _ in range(3)]
        assert [m.offset for m in got if isinstance(m, Message)] == [0, 1, 2]
        consumer.commit(0, 3)
        started = time.monotonic()
        more = [next(consumer) for _ in range(3)]  # the stream has room again at once, not after 60 s
        assert [m.offset for m in more if isinstance(m, Message)] == [3, 4, 5]
        assert time.monotonic() - started < 30
        consumer.commit(0, 6)
        wait_until(lambda: client.groups.lag("c-commit", "s").partitions[0].in_flight == 0, 10,
                   "the committed records' leases to go")
        lag = client.groups.lag("c-commit", "s").partitions[0]
        assert (lag.committed, lag.lag, lag.in_flight) == (6, 0, 0)


def test_settling_with_another_topics_token_is_refused(client: Client, cluster: DevCluster) -> None:
    for topic in ("c-mine", "c-other"):
        client.create_topic(topic, 1)
        client.publish(topic, b"x")
        client.groups.create(topic, "g")
    with client.subscribe("c-other", group="g") as other:
        foreign = next(other)
        assert isinstance(foreign, Message)
        s = stubs(cluster.wait_ready())
        try:
            for call in (lambda: s.broker.Ack(broker_pb2.AckRequest(
                             topic="c-mine", group="g", positions=[foreign.position]), timeout=30),
                         lambda: s.broker.Nack(broker_pb2.NackRequest(
                             topic="c-mine", group="g", positions=[foreign.position]), timeout=30)):
                code, message = refused(call)
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, message)
                assert "is a record of topic 'c-other', not of 'c-mine'" in message, message
        finally:
            s.close()
        assert foreign.ack()  # still unsettled in its own group


def test_lag_counts_a_retried_record_in_flight_again_as_in_flight_only(client: Client) -> None:
    client.create_topic("c-retry", 1)
    client.publish("c-retry", b"r")
    with client.subscribe("c-retry", group="q", mode="queue", base_delay_ms=10, max_attempts=5) as consumer:
        first = next(consumer)
        assert isinstance(first, Message)
        first.nack()
        again = next(consumer)
        assert isinstance(again, Message) and again.delivery_attempt == 2
        wait_until(lambda: client.groups.lag("c-retry", "q").partitions[0].in_flight == 1, 10,
                   "the redelivered record's lease")
        lag = client.groups.lag("c-retry", "q").partitions[0]
        assert (lag.in_flight, lag.retrying) == (1, 0), lag
        again.ack()


def test_a_heartbeat_to_a_queue_mode_group_is_refused(client: Client, cluster: DevCluster) -> None:
    """It answered OK with no partitions, as if the caller were a member of something."""
    client.create_topic("c-beat", 1)
    client.groups.create("c-beat", "q", mode="queue")
    s = stubs(cluster.wait_ready())
    try:
        code, message = refused(lambda: s.broker.Heartbeat(broker_pb2.HeartbeatRequest(
            topic="c-beat", group="q", member_id="m1"), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "queue-mode group" in message, (code, message)
    finally:
        s.close()
