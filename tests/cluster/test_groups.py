"""Consumer groups on a real 3-node cluster through the SDK (SPEC §3.2, §3.3, §6)."""

from __future__ import annotations

import asyncio
import collections
import signal
import threading
import time
import urllib.request
from typing import TypedDict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.client import Client, DeadLettersRetried, Event, GroupNotFound, InvalidArgument, Message
from broker.core import formats, records
from broker.devcluster import DevCluster
from broker.v1 import broker_pb2
from tests.cli.helpers import cli
from tests.cluster.group_helpers import Log, first_line, run_member, spawn_member
from tests.cluster.stubs import stubs
from tests.conftest import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def publish(client: Client, topic: str, n: int, key_count: int = 0) -> list[bytes]:
    values = [b"m%04d" % i for i in range(n)]
    for start in range(0, n, 500):
        chunk = values[start:start + 500]
        client.publish_batch(topic, [{"value": v, "key": b"k%d" % (i % key_count)} if key_count else v
                                     for i, v in enumerate(chunk, start)])
    return values


def test_two_groups_on_one_topic_each_receive_every_message(client: Client) -> None:
    client.create_topic("g-two", 3)
    values = publish(client, "g-two", 300)
    got: dict[str, list[bytes]] = {}
    for group in ("billing", "analytics"):
        seen: list[bytes] = []

        def handler(m: Message, seen: list[bytes] = seen) -> None:
            seen.append(m.value)

        handled = client.run("g-two", group=group, handler=handler, concurrency=4, batch_size=50, stop_at_end=True)
        got[group] = seen
        assert handled == 300
    for group, seen in got.items():
        assert sorted(seen) == values, f"{group} received every message once"
    lag = client.groups.lag("g-two", "billing")
    assert lag.lag == 0 and [p.committed for p in lag.partitions] == [p.end_offset for p in lag.partitions]


def _acks_started(metrics_address: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "raftbroker_grpc_server_started_total" and sample.labels.get("grpc_method") == "Ack")


def test_run_sends_the_acks_queued_while_one_call_is_in_flight_together(client: Client,
                                                                        cluster: DevCluster) -> None:
    """``batch_size=1`` (the default) waits for nothing, but the acks of workers that finished while
    an ``Ack`` was in flight share the next call (counted by the leader's own RPC counter)."""
    client.create_topic("g-acks", 2)
    values = publish(client, "g-acks", 400)
    leader = cluster.metrics_address(cluster.addresses.index(cluster.wait_ready()))
    before = _acks_started(leader)
    seen: list[bytes] = []
    assert client.run("g-acks", group="acks", handler=lambda m: seen.append(m.value), concurrency=16,
                      stop_at_end=True) == 400
    calls = _acks_started(leader) - before
    assert sorted(seen) == values
    lag = client.groups.lag("g-acks", "acks")
    assert lag.lag == 0 and sum(p.in_flight + p.retrying for p in lag.partitions) == 0, "every message settled"
    assert 1 <= calls <= 200, f"{calls:.0f} Ack calls for 400 acks"



def test_run_without_on_event_logs_the_records_pruned_before_anyone_received_them(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    """SPEC §3.3: ``run`` hands its handler messages only; a group's SKIP_FORWARD goes to
    ``on_event``, and without one it is a logged warning (before, the default dropped it)."""
    client.create_topic("g-lost", 1)
    publish(client, "g-lost", 6)
    seen: list[bytes] = []
    assert client.run("g-lost", group="lost", handler=lambda m: seen.append(m.value), limit=1, max_in_flight=1) == 1
    assert client.prune("g-lost", 4, partition=0) == 4  # 1-3 go before the group received them
    with caplog.at_level("WARNING", logger="broker.client.handlers"):
        assert client.run("g-lost", group="lost", handler=lambda m: seen.append(m.value), stop_at_end=True) == 2
    assert len(seen) == 3
    warned = [r.getMessage() for r in caplog.records if "skip_forward" in r.getMessage()]
    assert len(warned) == 1 and "g-lost" in warned[0], caplog.text
    assert client.groups.lag("g-lost", "lost").partitions[0].committed == 6, "told and acked: past the gap"


def test_records_given_back_then_pruned_are_told_once_and_not_dead_lettered(client: Client) -> None:
    """A consumer that took more than it handled (``max_in_flight`` 4, ``limit`` 1) gives the rest
    back when it stops, and those are pruned. The next consumer is told with one SKIP_FORWARD for
    the whole gap, as for records nobody was handed. Before, each record given back was also
    reported as BADMSG and dead-lettered without a body (the README tour's ``consume --group
    --limit`` then ``prune`` showed it)."""
    client.create_topic("g-given", 1)
    publish(client, "g-given", 6)
    assert client.run("g-given", group="given", handler=lambda m: None, limit=1, max_in_flight=4) == 1
    assert client.prune("g-given", 4, partition=0) == 4
    events: list[Event] = []
    assert client.run("g-given", group="given", handler=lambda m: None, on_event=events.append, stop_at_end=True) == 2
    assert [(e.type, e.offset_before, e.offset_after) for e in events] == [("skip_forward", 1, 4)]
    lag = client.groups.lag("g-given", "given").partitions[0]
    assert (lag.committed, lag.dead) == (6, 0)

def test_a_retry_of_dead_letters_leaves_the_pruned_ones_dead_and_says_so(client: Client, cluster: DevCluster) -> None:
    """Dead letters at offsets 0, 1 and 3, then a prune below 2: a retry of all sends back offset
    3 alone and answers one pruned, the CLI says so, and the consumer gets offset 3 with no BADMSG
    and no new dead letter. Before, all three went back and the pruned two died again."""
    wait_until(lambda: client.cluster_status().leader is not None
               and client.cluster_status().leader.cluster_format >= formats.PRUNED_DEAD_FORMAT,  # type: ignore[union-attr]
               60, "the cluster's command format raised by the leader's housekeeping")
    client.create_topic("g-dead-pruned", 1)
    publish(client, "g-dead-pruned", 5)

    def handler(m: Message) -> None:
        if m.offset in (0, 1, 3):
            m.discard("bad")
        else:
            m.ack()

    assert client.run("g-dead-pruned", group="dp", handler=handler, ack="manual", stop_at_end=True) == 5
    assert [d.offset for d in client.groups.dead_letters("g-dead-pruned", "dp")] == [0, 1, 3]
    assert client.prune("g-dead-pruned", 2, partition=0) == 2
    out = cli(cluster.addresses[0], "group", "dlq", "retry", "g-dead-pruned", "dp", "0:0").stdout
    assert "retried 0 dead letter(s); 1 left dead: their records were pruned" in out, out
    assert client.groups.retry_all_dead_letters("g-dead-pruned", "dp") == DeadLettersRetried(retried=1, pruned=2)
    events: list[Event] = []
    seen: list[tuple[int, bytes]] = []
    assert client.run("g-dead-pruned", group="dp", handler=lambda m: seen.append((m.offset, m.value)),
                      on_event=events.append, stop_at_end=True) == 1
    assert seen == [(3, b"m0003")] and not [e for e in events if e.type == "badmsg"], events
    assert [(d.offset, d.reason) for d in client.groups.dead_letters("g-dead-pruned", "dp")] == [
        (0, "discarded: bad"), (1, "discarded: bad")], "the pruned two stay as they were"
    assert client.groups.lag("g-dead-pruned", "dp").partitions[0].dead == 2


def test_manual_acks_from_many_threads_share_requests_and_each_tells_its_own(client: Client,
                                                                           cluster: DevCluster) -> None:
    """``ack="manual"`` with 16 handlers each calling ``message.ack()``: every message settled, each
    ``ack`` answered True (it settled its own record, though it shared a request), in far fewer
    ``Ack`` calls than messages (the leader's own RPC counter)."""
    client.create_topic("g-manual", 2)
    values = publish(client, "g-manual", 400)
    leader = cluster.metrics_address(cluster.addresses.index(cluster.wait_ready()))
    before = _acks_started(leader)
    answers: list[bool] = []
    seen: list[bytes] = []
    lock = threading.Lock()

    def handler(m: Message) -> None:
        settled = m.ack()
        with lock:
            answers.append(settled)
            seen.append(m.value)

    assert client.run("g-manual", group="manual", handler=handler, ack="manual", concurrency=16,
                      stop_at_end=True) == 400
    calls = _acks_started(leader) - before
    assert sorted(seen) == values
    assert answers == [True] * 400, "each ack settled its own record"
    lag = client.groups.lag("g-manual", "manual")
    assert lag.lag == 0 and sum(p.in_flight + p.retrying for p in lag.partitions) == 0, "every message settled"
    assert 1 <= calls <= 200, f"{calls:.0f} Ack calls for 400 manual acks"


def test_an_ack_names_the_positions_it_did_not_settle(client: Client, cluster: DevCluster) -> None:
    """``AckResponse.not_settled`` over the raw API: a position acked before and a repeat within the
    request are listed, by index; ``settled`` counts the rest."""
    client.create_topic("g-not-settled", 1)
    publish(client, "g-not-settled", 3)
    with client.subscribe("g-not-settled", group="raw", max_in_flight=3) as consumer:
        messages = [item for _, item in zip(range(3), consumer, strict=False) if isinstance(item, Message)]
        assert len(messages) == 3
        a, b, c = (m.position for m in messages)
        raw = stubs(cluster.addresses[cluster.addresses.index(cluster.wait_ready())])
        try:
            ack = raw.broker.Ack
            first = ack(broker_pb2.AckRequest(topic="g-not-settled", group="raw", positions=[a]), timeout=10)
            assert (first.settled, list(first.not_settled)) == (1, [])
            second = ack(broker_pb2.AckRequest(topic="g-not-settled", group="raw", positions=[b, a, c, b]), timeout=10)
            assert (second.settled, list(second.not_settled)) == (2, [1, 3])
        finally:
            raw.close()


def test_queue_members_never_process_one_message_at_once(client: Client) -> None:
    client.create_topic("g-queue", 4)
    values = publish(client, "g-queue", 200)
    busy: set[bytes] = set()
    overlaps: list[bytes] = []
    lock = threading.Lock()

    def handle(m: Message) -> None:
        with lock:
            if m.value in busy:
                overlaps.append(m.value)
            busy.add(m.value)
        time.sleep(0.002)
        with lock:
            busy.discard(m.value)
        m.ack()
        with lock:
            acked.add(m.value)

    acked: set[bytes] = set()
    log, stop = Log(), threading.Event()
    members = [run_member(client, "g-queue", "workers", f"w{i}", log, stop, handle, max_in_flight=8)
               for i in range(3)]
    # acked, not only received: a member stopped while it still handles a message hands it back
    # (Consumer.close releases what is unsettled), and another member would get it again
    wait_until(lambda: len(acked) == 200, 60, "every message processed")
    stop.set()
    for m in members:
        m.join(10)
    assert not overlaps
    assert sorted(set(log.values())) == values
    assert len(log.values()) == 200, "nothing delivered twice without a failure"
    assert len({name for name, _, _ in log.deliveries}) == 3, "the work was shared"


class OrderOptions(TypedDict, total=False):
    """The subscribe options the per-key order test varies between its groups."""

    mode: str
    session_timeout_ms: int
    ordered: bool


def test_per_key_order_holds_in_stream_mode_and_with_ordered_queue(client: Client) -> None:
    client.create_topic("g-order", 4)
    publish(client, "g-order", 400, key_count=8)
    cases: list[tuple[str, OrderOptions]] = [("streamers", {"mode": "stream", "session_timeout_ms": 3000}),
                                             ("ordered", {"mode": "queue", "ordered": True})]
    for group, options in cases:
        log, stop = Log(), threading.Event()
        members = [run_member(client, "g-order", group, f"{group}{i}", log, stop, max_in_flight=16, **options)
                   for i in range(3)]

        def every_message(log: Log = log) -> bool:
            return len(set(log.values())) == 400

        wait_until(every_message, 60, f"{group}: every message")
        stop.set()
        for m in members:
            m.join(10)
        per_key: dict[bytes | None, list[int]] = collections.defaultdict(list)
        for _, message, _ in log.deliveries:
            per_key[message.key].append(int(message.value[1:]))
        for key, numbers in per_key.items():
            firsts = list(dict.fromkeys(numbers))  # a redelivery after a rebalance repeats, never reorders
            assert firsts == sorted(firsts), f"{group}: key {key!r} out of order"


def test_a_member_killed_mid_lease_gets_its_message_redelivered_after_the_timeout(
        client: Client, cluster: DevCluster) -> None:
    client.create_topic("g-kill", 1)
    values = publish(client, "g-kill", 20)
    proc = spawn_member(",".join(cluster.addresses), "g-kill", "crashy", "queue", visibility_timeout_ms=2000,
                        base_delay_ms=10)
    try:
        line = first_line(proc, 30)
        taken = line.split()[-1].encode()
        killed_at = time.monotonic()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    log, stop = Log(), threading.Event()
    member = run_member(client, "g-kill", "crashy", "survivor", log, stop)
    wait_until(lambda: len(set(log.values())) == 20, 30, "every message processed")
    stop.set()
    member.join(10)
    assert sorted(set(log.values())) == values, "nothing lost"
    [(_, again, at)] = [d for d in log.deliveries if d[1].value == taken]
    assert again.delivery_attempt == 2, "the killed member's attempt counted"
    assert at - killed_at >= 1.0, "redelivered only once its lease ran out"
    assert len(log.deliveries) == 20, "processed once more, nothing else twice"


def test_always_failing_handler_backs_off_lands_in_dead_letters_and_retry_brings_it_back(client: Client) -> None:
    client.create_topic("g-fail", 1)
    client.publish("g-fail", b"poison", key=b"p")
    client.publish("g-fail", b"fine")
    attempts: list[tuple[float, int]] = []

    def handle(m: Message) -> None:
        if m.value == b"poison":
            attempts.append((time.monotonic(), m.delivery_attempt))
            raise RuntimeError("cannot handle this")

    stop = threading.Event()
    runner = threading.Thread(target=lambda: client.run(
        "g-fail", group="strict", handler=handle, stop=stop, max_attempts=3, base_delay_ms=300, max_delay_ms=2000,
        backoff="exponential"), daemon=True)
    runner.start()

    def dead_count() -> int:
        try:
            return client.groups.lag("g-fail", "strict").partitions[0].dead
        except GroupNotFound:  # the runner has not created the group yet
            return 0

    wait_until(lambda: dead_count() == 1, 30, "the poison dead-lettered")
    assert [a for _, a in attempts] == [1, 2, 3]
    gaps = [b - a for (a, _), (b, _) in zip(attempts, attempts[1:], strict=False)]
    assert 0.27 <= gaps[0] < 1.5 and 0.57 <= gaps[1] < 1.8, f"exponential backoff 300 ms, 600 ms: {gaps}"
    [dead] = client.groups.dead_letters("g-fail", "strict")
    assert (dead.offset, dead.attempts) == (0, 3) and "attempt 3 of 3" in dead.reason
    assert dead.record is not None and dead.record.value == b"poison" and dead.record.topic == "g-fail.strict.dlq"
    assert dead.record.headers["dlq.offset"] == "0" and dead.record.key == b"p"
    dlq = [r.value for r in client.subscribe("g-fail.strict.dlq", stop_at_end=True) if not isinstance(r, Event)]
    assert dlq == [b"poison"], "the dead-letter topic is a normal topic"
    lag = client.groups.lag("g-fail", "strict").partitions[0]
    assert (lag.committed, lag.lag, lag.retrying, lag.dead) == (2, 0, 0, 1)
    attempts.clear()
    assert client.groups.retry_dead_letters("g-fail", "strict", [(0, 0)]) == DeadLettersRetried(1, 0)
    wait_until(lambda: len(attempts) >= 1, 10, "the retried dead letter delivered again")
    assert attempts[0][1] == 1, "attempts start over"
    stop.set()
    runner.join(10)


def test_seek_replay_pause_resume_and_lag_by_hand_count(client: Client) -> None:
    client.create_topic("g-ops", 2)
    early = publish(client, "g-ops", 10)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    client.publish_batch("g-ops", [b"late%d" % i for i in range(6)])
    assert client.run("g-ops", group="ops", handler=lambda m: None, stop_at_end=True) == 16
    moved = client.groups.seek("g-ops", "ops", timestamp_ms=cut)
    assert sum(client.describe_topic("g-ops").partitions[p].end_offset - o for p, o in moved.items()) == 6
    consumer = client.subscribe("g-ops", group="ops", stop_at_end=True, max_in_flight=100)
    replayed = [m for m in consumer if isinstance(m, Message)]
    assert sorted(m.value for m in replayed) == sorted(b"late%d" % i for i in range(6))
    acked = [m for m in replayed if m.value in (b"late0", b"late3", b"late5")]
    consumer.ack(acked)
    unacked = {m.partition: 0 for m in replayed}
    for m in replayed:
        if m not in acked:
            unacked[m.partition] += 1
    in_flight = client.groups.lag("g-ops", "ops")
    assert [p.lag for p in in_flight.partitions] == [unacked.get(p, 0) for p in (0, 1)], "lag = unsettled by hand"
    assert [p.in_flight for p in in_flight.partitions] == [unacked.get(p, 0) for p in (0, 1)]
    consumer.close()
    assert sum(p.in_flight for p in client.groups.lag("g-ops", "ops").partitions) == 0, "closing gave them back"
    assert client.groups.pause("g-ops") == ["ops"]
    assert client.groups.lag("g-ops", "ops").paused
    assert client.run("g-ops", group="ops", handler=lambda m: None, stop_at_end=True) == 0, "paused: nothing"
    client.groups.resume("g-ops", "ops")
    assert client.run("g-ops", group="ops", handler=lambda m: None, stop_at_end=True) == 3
    client.groups.replay("g-ops", "ops", timestamp_ms=0)
    assert client.run("g-ops", group="ops", handler=lambda m: None, stop_at_end=True) == len(early) + 6
    lag = client.groups.lag("g-ops", "ops")
    assert lag.lag == 0 and lag.lag_seconds == 0


def test_reset_after_drop_and_recreate(client: Client) -> None:
    client.create_topic("g-reset", 1)
    publish(client, "g-reset", 3)
    assert client.run("g-reset", group="r", handler=lambda m: None, stop_at_end=True) == 3
    old = client.describe_topic("g-reset").incarnation
    client.drop_topic("g-reset")
    client.create_topic("g-reset", 1)
    client.publish_batch("g-reset", [b"x", b"y"])
    consumer = client.subscribe("g-reset", group="r", stop_at_end=True)
    items = list(consumer)
    event = items[0]
    assert isinstance(event, Event) and event.type == "reset"
    assert (event.offset_before, event.offset_after) == (3, 0) and str(old) in event.detail
    assert event.position_before != event.position_after
    assert [m.value for m in items[1:] if isinstance(m, Message)] == [b"x", b"y"]
    consumer.close()
    again = list(client.subscribe("g-reset", group="r", stop_at_end=True))
    assert again[0] == event, "re-subscribing reports the same event, then the same records"
    client.groups.delete("g-reset", "r")
    with pytest.raises(GroupNotFound):
        client.groups.lag("g-reset", "r")


def test_stream_mode_partitions_move_when_a_member_dies(client: Client, cluster: DevCluster) -> None:
    client.create_topic("g-stream", 2)
    publish(client, "g-stream", 40)
    proc = spawn_member(",".join(cluster.addresses), "g-stream", "s", "stream", session_timeout_ms=1500,
                        visibility_timeout_ms=60_000)
    try:
        first_line(proc, 30)
        info = client.groups.describe("g-stream", "s")
        assert list(info.members.values()) == [(0, 1)], "one member owns both partitions"
        log, stop = Log(), threading.Event()
        member = run_member(client, "g-stream", "s", "heir", log, stop, mode="stream")
        time.sleep(1.0)
        assert not log.deliveries, "the live member keeps its partitions"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: len(set(log.values())) == 40, 30, "the heir gets every partition after the session")
        stop.set()
        member.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for p in (0, 1):
        offsets = [m.offset for _, m, _ in log.deliveries if m.partition == p]
        assert offsets == sorted(offsets) == list(range(len(offsets))), "in order, from the watermark"


def test_group_metrics_report_lag_in_flight_retries_and_dead_letters(client: Client, cluster: DevCluster) -> None:
    client.create_topic("g-metrics", 1)
    client.publish_batch("g-metrics", [b"hold", b"retry", b"poison"])
    consumer = client.subscribe("g-metrics", group="m", stop_at_end=True)
    got = {m.value: m for m in consumer if isinstance(m, Message)}
    got[b"retry"].nack(delay_ms=60_000)
    got[b"poison"].discard("unparseable")
    leader = cluster.leader()
    assert leader is not None
    text = urllib.request.urlopen(f"http://{cluster.metrics_address(leader)}/metrics", timeout=5).read().decode()
    labels = '{group="m",partition="0",topic="g-metrics"}'
    for metric, value in (("lag_records", 2.0), ("in_flight", 1.0), ("retrying", 1.0), ("dead_letters", 1.0)):
        assert f"raftbroker_group_{metric}{labels} {value}" in text, metric
    assert f"raftbroker_group_lag_seconds{labels}" in text
    consumer.close()


def test_async_iteration_and_manual_handlers_that_do_not_settle_nack(client: Client) -> None:
    client.create_topic("g-async", 1)
    client.publish_batch("g-async", [b"a", b"b"])

    async def consume() -> list[tuple[bytes, int]]:
        seen = []
        async with client.subscribe("g-async", group="aio", stop_at_end=True) as consumer:
            async for message in consumer:
                assert isinstance(message, Message)
                seen.append((message.value, message.delivery_attempt))
                await message.ack_async()
        return seen

    assert asyncio.run(consume()) == [(b"a", 1), (b"b", 1)]
    assert client.groups.lag("g-async", "aio").lag == 0
    calls: list[tuple[bytes, int]] = []

    def forgetful(m: Message) -> None:
        calls.append((m.value, m.delivery_attempt))
        if m.delivery_attempt > 1:
            m.ack()

    stop = threading.Event()
    runner = threading.Thread(target=lambda: client.run("g-async", group="manual", handler=forgetful, ack="manual",
                                                        stop=stop, base_delay_ms=50), daemon=True)
    runner.start()
    wait_until(lambda: len(calls) == 4, 20, "both records nacked once, then acked")
    stop.set()
    runner.join(10)
    assert sorted(calls) == [(b"a", 1), (b"a", 2), (b"b", 1), (b"b", 2)]
    assert client.groups.lag("g-async", "manual").lag == 0


def test_a_nack_after_the_lease_ran_out_and_a_receipt_past_the_end_change_nothing(client: Client) -> None:
    """Before: a late nack counted a second failed attempt for one delivery (dead-lettered "attempt 2
    of 2" after one delivery), and an ack of a receipt past the partition's end settled that offset
    ahead, so the record written there later was never delivered."""
    client.create_topic("g-late", 1)
    client.publish("g-late", b"only")
    consumer = client.subscribe("g-late", group="w", visibility_timeout_ms=300, backoff="fixed",
                                base_delay_ms=60_000, max_attempts=2)
    try:
        message = next(m for m in consumer if isinstance(m, Message))
        wait_until(lambda: client.groups.lag("g-late", "w").partitions[0].retrying == 1, 10, "the lease to run out")
        assert message.extend(1000) == 0, "the lease ran out"
        message.nack()
        row = client.groups.lag("g-late", "w").partitions[0]
        assert (row.committed, row.retrying, row.dead) == (0, 1, 0), row
        assert client.groups.dead_letters("g-late", "w") == []
        ahead = records.position_token(client.describe_topic("g-late").incarnation, 0, 2)
        request = broker_pb2.AckRequest(topic="g-late", group="w", positions=[ahead])
        with pytest.raises(InvalidArgument, match="ends at offset 1"):
            client._router.call(lambda a, t: client._router.broker(a).Ack(request, timeout=t), write=True,
                                what="ack")
        client.publish("g-late", b"next")
        row = client.groups.lag("g-late", "w").partitions[0]
        assert (row.end_offset, row.committed, row.lag) == (2, 0, 2), row
    finally:
        consumer.close()


def test_a_late_nack_extend_or_release_of_an_earlier_delivery_leaves_the_next_holder_alone(client: Client) -> None:
    """A consumer whose lease ran out while it worked nacks, extends or releases the record after it was
    delivered to another. Before delivery tokens the nack failed the other's delivery (dead-lettered as
    "attempt 2 of 2" while the other worked on it, whose ack then settled nothing), the extend lengthened
    the other's lease, and the release handed the record to a third consumer."""
    wait_until(lambda: client.cluster_status().leader is not None
               and client.cluster_status().leader.cluster_format >= formats.DELIVERY_TOKEN_FORMAT,  # type: ignore[union-attr]
               60, "the cluster's command format raised by the leader's housekeeping")
    client.create_topic("g-stale", 1)
    client.publish("g-stale", b"only")
    options = {"visibility_timeout_ms": 500, "backoff": "fixed", "base_delay_ms": 10, "max_attempts": 2}
    # the slow consumer claims one record and its stream ends there (else the redelivery comes back to it)
    slow = client.subscribe("g-stale", group="w", stop_at_end=True, max_in_flight=1, max_batch=1, **options)
    other = None
    try:
        [late] = [m for m in slow if isinstance(m, Message)]
        wait_until(lambda: client.groups.lag("g-stale", "w").partitions[0].retrying == 1, 10, "the lease to run out")
        other = client.subscribe("g-stale", group="w", **options)
        held = next(m for m in other if isinstance(m, Message))
        assert (held.value, held.delivery_attempt) == (b"only", 2)
        assert held.extend(60_000) > 0, "the next holder keeps its lease for a minute"
        assert late.extend(60_000) == 0, "the earlier delivery's lease is over"
        before = client.groups.lag("g-stale", "w").partitions[0]
        assert (before.in_flight, before.dead) == (1, 0), before
        late.nack()
        request = broker_pb2.NackRequest(topic="g-stale", group="w", positions=[late.position], release=True)
        client._router.call(lambda a, t: client._router.broker(a).Nack(request, timeout=t), write=True, what="nack")
        after = client.groups.lag("g-stale", "w").partitions[0]
        assert (after.in_flight, after.retrying, after.dead) == (before.in_flight, before.retrying, 0), after
        assert client.groups.dead_letters("g-stale", "w") == []
        assert held.ack(), "the next holder's ack settles the record"
        assert client.groups.lag("g-stale", "w").partitions[0].lag == 0
    finally:
        slow.close()
        if other is not None:
            other.close()


def test_a_record_delivered_again_to_the_same_consumer_is_unsettled_once(client: Client) -> None:
    """Each delivery has a position of its own: the consumer's unsettled list keeps the latest one per record."""
    client.create_topic("g-again", 1)
    client.publish("g-again", b"only")
    consumer = client.subscribe("g-again", group="w", visibility_timeout_ms=300, backoff="fixed", base_delay_ms=10)
    try:
        items = (m for m in consumer if isinstance(m, Message))
        first = next(items)
        second = next(items)  # the lease ran out: delivered again, to the only stream
        assert (first.value, second.value, second.delivery_attempt) == (b"only", b"only", 2)
        assert first.position != second.position
        assert consumer.unsettled() == [second]
        assert second.ack()
        assert consumer.unsettled() == []
    finally:
        consumer.close()
