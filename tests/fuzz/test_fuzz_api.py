"""The fuzz tier: generated requests for every gRPC method against one real 3-node cluster.

After every request: no INTERNAL (or UNKNOWN) status; a request that was refused changed nothing
(topics with their configs and end offsets, groups with their configs, routes); and a canary
publish commits and every node applies past it (no request stops the log). Seeded and bounded:
``RAFTBROKER_FUZZ_EXAMPLES`` (default 400, about a minute on a quiet machine) and ``RAFTBROKER_FUZZ_SEED``.
``AddNode`` / ``RemoveNode`` are left out: a valid one really changes the membership of the
cluster under test (their validation has its own tests in tests/cluster/test_membership.py).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, note, seed, settings
from hypothesis import strategies as st

from broker.devcluster import DevCluster
from broker.v1 import admin_pb2, broker_pb2, common_pb2, routes_pb2
from tests.cluster.digests import wait_converged
from tests.cluster.stubs import Stubs, stubs
from tests.fuzz.requests import RequestStrategies, message_class

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(3600)]

EXAMPLES = int(os.environ.get("RAFTBROKER_FUZZ_EXAMPLES", "400"))
SEED = int(os.environ.get("RAFTBROKER_FUZZ_SEED", "20261124"))
CALL_TIMEOUT_S = 10.0
STREAM_READS_MAX = 3
SKIPPED = {"AddNode", "RemoveNode"}
TOPICS = ["fz", "fz2", "y" * 245]  # the last: valid, but its dead-letter names would be too long
GROUPS = ["fg", "fs"]
CANARY = "fuzz-canary"
# our own deadline on a bounded stream read, or a commit that may or may not have happened
_NOT_A_REFUSAL = {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}

one_outcomes: Counter[str] = Counter()
METHODS: dict[str, MethodDescriptor] = {
    f"{service.name}.{m.name}": m for module in (broker_pb2, admin_pb2, routes_pb2)
    for service in module.DESCRIPTOR.services_by_name.values() for m in service.methods if m.name not in SKIPPED
}


def restore(s: Stubs) -> list[int]:
    """Re-create whatever of the known topics and groups an earlier request dropped (so requests
    keep reaching deep code); returns the topics' incarnations."""
    have = {t.config.name: t.incarnation for t in s.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=30).topics}
    for name in [*TOPICS, CANARY]:
        if name not in have:
            config = admin_pb2.TopicConfig(name=name, partitions=2)
            have[name] = s.admin.CreateTopic(admin_pb2.CreateTopicRequest(config=config), timeout=30).incarnation
            records = [broker_pb2.PublishRecord(value=b"r%d" % i, key=b"k%d" % (i % 3)) for i in range(10)]
            s.broker.Publish(broker_pb2.PublishRequest(topic=name, records=records), timeout=30)
    groups = {g.group for g in s.admin.ListGroups(admin_pb2.ListGroupsRequest(topic="fz"), timeout=30).groups}
    stream = common_pb2.GroupConfig(mode=common_pb2.DELIVERY_MODE_STREAM)
    for group, config in (("fg", common_pb2.GroupConfig()), ("fs", stream)):
        if group not in groups:
            s.admin.CreateGroup(admin_pb2.CreateGroupRequest(topic="fz", group=group, config=config), timeout=30)
    return [have[t] for t in TOPICS]


@pytest.fixture(scope="module")
def setup(cluster: DevCluster) -> Iterator[tuple[DevCluster, RequestStrategies]]:
    s = stubs(cluster.wait_ready())
    try:
        incarnations = restore(s)
    finally:
        s.close()
    yield cluster, RequestStrategies(TOPICS, GROUPS, incarnations)


def call(channel: grpc.Channel, method: MethodDescriptor, request: Message) -> grpc.StatusCode:
    """Send ``request``; streams are read for at most a few responses. Returns the status."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    reply = message_class(method.output_type)
    kwargs = {"request_serializer": lambda m: m.SerializeToString(), "response_deserializer": reply.FromString}
    try:
        if method.client_streaming:
            responses = channel.stream_stream(path, **kwargs)(iter([request]), timeout=CALL_TIMEOUT_S)
            _read_some(responses)
        elif method.server_streaming:
            _read_some(channel.unary_stream(path, **kwargs)(request, timeout=CALL_TIMEOUT_S))
        else:
            channel.unary_unary(path, **kwargs)(request, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()
        note(f"status {code.name}: {exc.details()}")
        return code
    return grpc.StatusCode.OK


def _read_some(responses: Iterator[Message]) -> None:
    for i, _ in enumerate(responses):
        if i + 1 >= STREAM_READS_MAX:
            responses.cancel()  # type: ignore[attr-defined]
            return


def state_digest(s: Stubs) -> tuple[object, ...]:
    """What a refused request must not change (background work such as lease expiry is left out)."""
    topics = s.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=30).topics
    view: list[object] = []
    for t in sorted(topics, key=lambda t: t.config.name):
        view.append((t.config.SerializeToString(deterministic=True), t.incarnation,
                     tuple(p.end_offset for p in t.partitions)))
        groups = s.admin.ListGroups(admin_pb2.ListGroupsRequest(topic=t.config.name), timeout=30).groups
        view += sorted((g.group, g.config.SerializeToString(deterministic=True), g.paused) for g in groups)
    routes = s.admin.ListRoutes(routes_pb2.ListRoutesRequest(), timeout=30)
    view.append(routes.SerializeToString(deterministic=True))
    return tuple(view)


def canary(cluster: DevCluster) -> None:
    """A publish commits and every node applies past it."""
    s = stubs(cluster.wait_ready(60))
    try:
        s.broker.Publish(broker_pb2.PublishRequest(topic=CANARY, records=[broker_pb2.PublishRecord(value=b"c")]),
                         timeout=30)
        applied = s.admin.NodeStatus(admin_pb2.NodeStatusRequest(), timeout=30).applied_index
    finally:
        s.close()
    assert wait_converged(cluster, 60) >= applied


def test_no_request_gets_internal_changes_anything_when_refused_or_stops_the_log(
        setup: tuple[DevCluster, RequestStrategies]) -> None:
    cluster, strategies = setup
    method_and_request = st.sampled_from(sorted(METHODS)).flatmap(
        lambda name: st.tuples(st.just(name), strategies.request(METHODS[name])))

    @seed(SEED)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(method_and_request)
    def one(pair: tuple[str, Message]) -> None:
        name, request = pair
        method = METHODS[name]
        note(f"{name}({request!r})")
        s = stubs(cluster.wait_ready(60))
        try:
            before = state_digest(s)
            code = call(s.channel, method, request)
            one_outcomes[f"{name} {code.name}"] += 1
            assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), f"{method.name}: {code}"
            if code != grpc.StatusCode.OK and code not in _NOT_A_REFUSAL:
                assert state_digest(s) == before, f"refused {method.name} ({code.name}) changed the state"
            canary(cluster)
            restore(s)
        finally:
            s.close()

    outcomes: Counter[str] = Counter()
    one_outcomes.clear()
    one()
    outcomes.update(one_outcomes)
    print("fuzz outcomes (method status: count):", dict(sorted(outcomes.items())))
