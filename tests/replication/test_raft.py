"""PysyncobjReplicator specifics, in-process: options, failure mapping, back-pressure, close."""

from __future__ import annotations

import contextlib
import itertools
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from broker.replication import CommandPieces, FailReason, ReplicationError, Role, raft, raft_node
from broker.replication.raft import APPEND_ENTRIES_BATCH_BYTES_MAX, RaftOptions, map_fail_reason
from broker.replication.transport import HandshakeLimits

from .chain_sm import ChainStateMachine, command_id, read_records
from .cluster import free_port, wait_until
from .conftest import FAST_OPTIONS, Outcomes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class GatedStateMachine(ChainStateMachine):
    """Blocks the replication thread inside ``apply`` until the gate opens."""

    gate = threading.Event()
    entered = threading.Event()

    def apply(self, index: int, command: bytes | memoryview) -> object:
        self.entered.set()
        assert self.gate.wait(10)
        return super().apply(index, command)


@pytest.mark.parametrize("overrides, rule", [
    ({"raft_min_timeout_s": 0.15, "append_entries_period_s": 0.05}, "raft_min_timeout_s > 3"),
    ({"raft_max_timeout_s": 0.3}, "raft_max_timeout_s > raft_min_timeout_s"),
    ({"max_pending_bytes": 10}, "max_pending_bytes >= max_command_bytes"),
    ({"commands_queue_size": 0}, "positive"),
    ({"socket_send_buffer_bytes": 8192}, "socket buffers between 64 KiB and 64 MiB"),
    ({"socket_receive_buffer_bytes": 128 * 1024 * 1024}, "socket buffers between 64 KiB and 64 MiB"),
    ({"append_entries_batch_bytes": 1024}, "append_entries_batch_bytes is None or between 64 KiB"),
    ({"append_entries_batch_bytes": 32 * 1024 * 1024}, "append_entries_batch_bytes is None or between"),
    ({"idle_poll_max_s": 0.005}, "auto_tick_period_s <= idle_poll_max_s <= 1"),
    ({"idle_poll_max_s": 2.0}, "auto_tick_period_s <= idle_poll_max_s <= 1"),
])
def test_inconsistent_options_are_rejected(overrides: dict[str, Any], rule: str) -> None:
    with pytest.raises(ValueError, match=rule):
        RaftOptions(**overrides)


@pytest.mark.parametrize("limits", [{"timeout_s": 0.0}, {"per_host_max": 0}, {"per_host_max": 300}])
def test_inconsistent_handshake_limits_are_rejected(limits: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="timeout_s > 0 and 1 <= per_host_max <= total_max"):
        RaftOptions(handshake=HandshakeLimits(**limits))


def test_long_connection_timeouts_leave_the_handshake_deadline_alone() -> None:
    """The drills run nodes with 60 s connection timeouts; the handshake deadline is its own."""
    options = RaftOptions(connection_timeout_s=60.0, leader_fallback_timeout_s=60.0)
    assert options.handshake == HandshakeLimits(timeout_s=10.0, per_host_max=16, total_max=256)


def test_no_command_is_chunked_with_the_default_batch_size(tmp_path: Any) -> None:
    """pysyncobj sends a command at least appendEntriesBatchSizeBytes long as chunks (a message and a
    reply each, re-joined quadratically): by default the batch size is above the largest command."""
    def batch(**overrides: Any) -> int:
        conf = RaftOptions(**overrides).to_conf(tmp_path / "j", tmp_path / "d", lambda *_: None, lambda *_: (),
                                                bind_address="x:1")
        return int(conf.appendEntriesBatchSizeBytes)

    wrapper = len(pickle.dumps((1, (b"x" * 1000,), {}), protocol=5)) - 1000  # pysyncobj's around a command
    for limit in (4 * 1024 * 1024, 9 * 1024 * 1024):
        assert batch(max_command_bytes=limit, max_pending_bytes=limit) > limit + wrapper
    assert batch(max_command_bytes=65 << 20, max_pending_bytes=65 << 20) == APPEND_ENTRIES_BATCH_BYTES_MAX
    assert batch(append_entries_batch_bytes=64 * 1024) == 64 * 1024


def test_socket_buffers_default_to_a_whole_command_out_and_256_kib_in(tmp_path: Any) -> None:
    def conf(options: RaftOptions) -> Any:
        return options.to_conf(tmp_path / "j", tmp_path / "d", lambda *_: None, lambda *_: (), bind_address="x:1")
    default = conf(RaftOptions())
    assert (default.sendBufferSize, default.recvBufferSize) == (RaftOptions().max_command_bytes, 256 * 1024)
    chosen = conf(RaftOptions(socket_send_buffer_bytes=512 * 1024, socket_receive_buffer_bytes=128 * 1024))
    assert (chosen.sendBufferSize, chosen.recvBufferSize) == (512 * 1024, 128 * 1024)


def test_every_pysyncobj_failure_maps_to_a_fail_reason() -> None:
    assert map_fail_reason(1) is FailReason.QUEUE_FULL
    assert map_fail_reason(2) is FailReason.NO_LEADER
    assert map_fail_reason(3) is FailReason.DISCARDED
    assert map_fail_reason(4) is FailReason.NOT_LEADER
    assert {map_fail_reason(code) for code in (5, 7)} == {FailReason.TIMEOUT}  # outcome unknown
    assert map_fail_reason(6) is FailReason.DISCARDED


def test_lone_member_without_a_leader_fails_fast_with_no_leader(single_node: Callable[..., Any]) -> None:
    rep, sm = single_node(peers=2, wait_leader=False)
    outcomes = Outcomes()
    rep.submit(b"x", outcomes.callback(0))
    error = outcomes.results[0][1]  # called before submit returned
    assert error is not None and error.reason is FailReason.NO_LEADER
    assert rep.status().role is not Role.LEADER and not rep.status().has_quorum


def test_pending_bytes_limit_gives_queue_full(single_node: Callable[..., Any], tmp_path: Any) -> None:
    GatedStateMachine.gate.clear()
    options = RaftOptions(raft_min_timeout_s=0.16, raft_max_timeout_s=0.3,
                          max_command_bytes=1000, max_pending_bytes=1500)
    rep, _ = single_node(options=options)
    sm = GatedStateMachine(tmp_path / "gated")
    rep._node._state_machine = sm
    outcomes = Outcomes()
    rep.submit(b"a" * 1000, outcomes.callback(0))  # blocks the replication thread in apply
    rep.submit(b"b" * 1000, outcomes.callback(1))
    error = outcomes.results[1][1]
    assert error is not None and error.reason is FailReason.QUEUE_FULL
    GatedStateMachine.gate.set()
    outcomes.wait(2)
    assert outcomes.results[0][1] is None and rep.pending_count() == 0
    sm.close()


def test_close_fails_pending_callbacks_once_with_timeout(
        single_node: Callable[..., Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    GatedStateMachine.gate.clear()
    GatedStateMachine.entered.clear()
    monkeypatch.setattr(raft, "_CLOSE_JOIN_S", 0.2)
    rep, _ = single_node()
    sm = GatedStateMachine(tmp_path / "gated")
    rep._node._state_machine = sm
    outcomes = Outcomes()
    for i in range(3):
        rep.submit(b"c%d" % i, outcomes.callback(i))
    assert GatedStateMachine.entered.wait(5) and rep.pending_count() == 3
    rep.close()  # the replication thread is stuck in apply: close gives up waiting for it
    assert {error.reason for _, error in outcomes.results.values() if error} == {FailReason.TIMEOUT}
    GatedStateMachine.gate.set()
    wait_until(lambda: sm.applied_index() > 0, 5, "the stuck apply to finish")
    assert outcomes.duplicates == 0 and len(outcomes.results) == 3
    sm.close()


def test_transfer_leadership_from_the_replication_thread_is_refused(single_node: Callable[..., Any]) -> None:
    rep, _ = single_node()
    answers: list[bool] = []

    def from_callback(result: object, error: ReplicationError | None) -> None:
        answers.append(rep.transfer_leadership())

    rep.submit(b"x", from_callback)
    wait_until(lambda: answers, 5, "the callback")
    assert answers == [False]


def test_compaction_thresholds_are_spread_across_nodes_and_not_deferred_on_a_lone_leader(
        single_node: Callable[..., Any]) -> None:
    """A leader with followers defers its thresholds 4x (test_cluster.py,
    ``test_the_leader_compacts_four_times_less_often_under_heavy_writes``); a lone one does not."""
    options = RaftOptions(raft_min_timeout_s=0.16, raft_max_timeout_s=0.3, compaction_min_entries=1000,
                          compaction_min_time_s=100.0)
    nodes = [single_node(options=options, peers=2, wait_leader=False)[0]._node for _ in range(4)]
    spreads = [n._compaction_min_entries / 1000 for n in nodes]
    assert all(1.0 <= s < 1.5 for s in spreads) and len(set(spreads)) > 1, spreads
    byte_spreads = [n._compaction_max_log_bytes / options.compaction_max_log_bytes for n in nodes]
    assert byte_spreads == pytest.approx(spreads, abs=0.002)  # the same node-specific factor
    assert all(n.conf.logCompactionMinEntries == n._compaction_min_entries for n in nodes)  # followers
    leader = single_node(options=options)[0]._node
    assert leader.conf.logCompactionMinEntries == leader._compaction_min_entries
    assert leader.conf.logCompactionMinTime == pytest.approx(leader._compaction_min_time_s)
    assert leader._compaction_bytes_trigger == leader._compaction_max_log_bytes


def test_the_replication_thread_s_part_of_a_snapshot_is_measured_apart(
        single_node: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction's snapshot holds the replication thread while the state machine takes it (nothing
    is applied or answered meanwhile); the rest (fsyncs, the dump) runs beside it. The first part is
    ``raftbroker_raft_snapshot_seconds{kind="take"}``, within the whole write's duration."""
    real_write = ChainStateMachine.write_snapshot

    def slow_write(self: ChainStateMachine, directory: str) -> None:
        time.sleep(0.05)
        real_write(self, directory)

    monkeypatch.setattr(ChainStateMachine, "write_snapshot", slow_write)
    rep, _ = single_node(options=RaftOptions(raft_min_timeout_s=0.16, raft_max_timeout_s=0.3,
                                             compaction_max_log_bytes=200_000))
    outcomes = Outcomes()
    for i in range(35):  # 35 x ~10 KB: past a lone leader's byte trigger (200,000 x a spread below 1.5) once
        rep.submit(b"%d" % i + bytes(10_000), outcomes.callback(i))
    outcomes.wait(35)
    stats = wait_until(lambda: (st := rep._counters.snapshot()).snapshot_write.count and st, 10, "a snapshot")
    assert stats.snapshot_take.count == stats.snapshot_write.count == 1  # one compaction: the byte trigger
    assert 0.05 <= stats.snapshot_take.sum_s <= stats.snapshot_write.sum_s


class SyncCheckingStateMachine(ChainStateMachine):
    """Records, at every apply, whether the node's journal still had a sync pending."""

    journal: Any = None
    unsynced_applies = 0

    def apply(self, index: int, command: bytes | memoryview) -> object:
        if self.journal is not None and self.journal.sync_pending:
            self.unsynced_applies += 1
        return super().apply(index, command)


def test_a_single_node_fsyncs_synced_entries_before_it_applies_them(
        single_node: Callable[..., Any], tmp_path: Any) -> None:
    rep, _ = single_node()
    journal = rep._node.journal
    sm = SyncCheckingStateMachine(tmp_path / "checking")
    sm.journal = journal
    rep._node._state_machine = sm
    before = journal.fsyncs
    outcomes = Outcomes()
    for i in range(200):
        rep.submit(b"s%d" % i, outcomes.callback(i), sync=True)
    outcomes.wait(200)
    assert all(error is None for _, error in outcomes.results.values())
    assert sm.unsynced_applies == 0
    synced = journal.fsyncs - before
    assert 1 <= synced <= 200, synced  # group commit: usually far fewer fsyncs than entries
    print(f"200 synced submits: {synced} fsyncs")
    sm.close()


@pytest.mark.parametrize("sync", [False, True])
def test_a_lone_leader_commits_in_the_tick_that_appends_the_entry(single_node: Callable[..., Any],
                                                                   sync: bool) -> None:
    """A single node is its own majority: it commits and applies an entry in the replication tick that
    appended it, not in the next one (which waits for the poll: up to ``auto_tick_period_s``). Counted
    in ticks, not timed. Synced entries are still fsynced before they are applied (test above)."""
    rep, _ = single_node()
    node = rep._node
    ticks = [0]  # ticks completed: the tick callbacks run after the tick's appends
    node.addOnTickCallback(lambda: ticks.__setitem__(0, ticks[0] + 1))
    journal = node.journal
    appended_in: dict[int, int] = {}
    stock_add = journal.add

    def add(command: bytes, idx: int, term: int) -> None:
        appended_in[idx] = ticks[0]
        stock_add(command, idx, term)

    journal.add = add  # observe the tick of every append (pysyncobj looks the method up per call)
    committed_in: dict[int, int] = {}
    for i in range(20):
        done = threading.Event()

        def callback(result: object, error: ReplicationError | None, done: threading.Event = done) -> None:
            assert error is None and isinstance(result, dict)
            committed_in[result["index"]] = ticks[0]
            done.set()

        rep.submit(b"c%d" % i, callback, sync=sync)
        assert done.wait(10), f"command {i} not committed"
    assert len(committed_in) == 20
    assert {index: appended_in[index] for index in committed_in} == committed_in


def _tick_times(node: Any) -> list[float]:
    """The monotonic time of each of ``node``'s ticks from now on (its tick callbacks run as a tick ends)."""
    times: list[float] = []
    node.addOnTickCallback(lambda: times.append(time.monotonic()))
    return times


def test_idle_nodes_poll_until_their_next_timer(tmp_path: Any) -> None:
    """``idle_poll_max_s``: pysyncobj's tick thread polls for ``auto_tick_period_s`` (10 ms) whatever
    the node does, so an idle node ticked ~100 times a second. Idle, a leader now waits for its next
    heartbeat (every 0.2 s here) and the followers' replies, a follower for the heartbeats it receives
    and at most ``idle_poll_max_s`` (0.1 s). Counted over a second, with a bound far below pysyncobj's
    and far above what the nodes need; a busy machine can only lower the count. The longer waits do not
    depose the leader, and a command still commits on every node."""
    options = RaftOptions(raft_min_timeout_s=0.8, raft_max_timeout_s=1.2, append_entries_period_s=0.2,
                          connection_timeout_s=2.0)
    assert options.idle_poll_max_s == 0.1
    with _three_nodes(tmp_path, options) as (nodes, leader):
        outcomes = Outcomes()
        leader.submit(b"first", outcomes.callback(0))
        outcomes.wait(1)
        first = outcomes.index(0)
        wait_until(lambda: all(sm.applied_index() >= first for _, sm in nodes), 10, "every node applied")
        wait_until(lambda: all(rep._node is not None and rep._node._idle() for rep, _ in nodes), 10, "idle nodes")
        term = leader.status().term
        ticks = {rep.status().self_address: _tick_times(rep._node) for rep, _ in nodes}
        start = time.monotonic()
        wait_until(lambda: all(times and times[-1] > start + 1.0 for times in ticks.values()), 10,
                   "every node ticked after the counted second")
        counts = {address: sum(1 for at in times if at <= start + 1.0) for address, times in ticks.items()}
        assert all(count < 40 for count in counts.values()), f"ticks in 1 s: {counts}"
        assert leader.status().role == Role.LEADER and leader.status().term == term
        leader.submit(b"second", outcomes.callback(1))
        outcomes.wait(2)
        second = outcomes.index(1)
        wait_until(lambda: all(sm.applied_index() >= second for _, sm in nodes), 10, "every node applied")
        assert len({sm.chain() for _, sm in nodes}) == 1


def test_an_idle_node_wakes_at_once_for_a_request_to_its_tick_thread(single_node: Callable[..., Any]) -> None:
    """A lone leader with a 1 s heartbeat and ``idle_poll_max_s`` 1 s polls about a second at a time
    when idle. A forced compaction (like a leadership transfer and ``close``, work for the tick thread
    asked from another thread) wakes it: the next tick comes long before the next heartbeat was due."""
    options = RaftOptions(raft_min_timeout_s=3.5, raft_max_timeout_s=4.0, append_entries_period_s=1.0,
                          connection_timeout_s=4.0, idle_poll_max_s=1.0)
    rep, _ = single_node(options)
    node = rep._node
    outcomes = Outcomes()
    rep.submit(b"c", outcomes.callback(0))
    outcomes.wait(1)
    wait_until(node._idle, 10, "an idle node")
    times = _tick_times(node)
    wait_until(lambda: len(times) >= 2, 10, "two idle ticks")
    gaps = [b - a for a, b in itertools.pairwise(list(times))]
    assert max(gaps) > 0.5, f"idle ticks {gaps} apart: the poll did not wait for the heartbeat"
    seen = len(times)
    wait_until(lambda: len(times) > seen, 10, "an idle tick")  # a heartbeat's tick: the next is ~1 s away
    asked_at = time.monotonic()
    rep.force_compaction()
    wait_until(lambda: not node._SyncObj__forceLogCompaction, 10, "the compaction's tick")
    assert time.monotonic() - asked_at < 0.5, "the tick thread slept through the request"


def test_a_failover_after_a_quiet_spell_keeps_the_followers_link(tmp_path: Any) -> None:
    """Followers send each other nothing between elections. pysyncobj's read timeout
    (``connection_timeout_s``) then made their link look dead: the first pre-vote after the leader died
    disconnected it (the message lost, a redial, another election timeout; 1.5-2.1 s failovers in a
    cluster that had run a while). After a quiet spell longer than the timeout, the followers' link
    survives the election and a new leader is elected over it."""
    options = RaftOptions(connection_timeout_s=1.0)  # elections 0.4-0.8 s, heartbeats 50 ms
    with _three_nodes(tmp_path, options) as (nodes, leader):
        outcomes = Outcomes()
        leader.submit(b"before", outcomes.callback(0))
        outcomes.wait(1)
        followers = [rep for rep, _ in nodes if rep is not leader]
        addresses = {rep.status().self_address for rep in followers}
        dropped: list[str] = []
        for rep in followers:
            assert rep._node is not None
            transport = rep._node._SyncObj__transport
            for node, conn in list(transport._connections.items()):
                if str(node.id) in addresses:  # the other follower
                    stock = conn.disconnect

                    def disconnect(stock: Any = stock, who: str = rep.status().self_address) -> None:
                        dropped.append(who)
                        stock()

                    conn.disconnect = disconnect  # pysyncobj calls self.disconnect()
        quiet_until = time.monotonic() + 1.5 * options.connection_timeout_s
        wait_until(lambda: time.monotonic() > quiet_until, 5, "a quiet spell between the followers")
        term = leader.status().term
        leader.close()
        new = wait_until(lambda: next((rep for rep in followers if rep.status().role == Role.LEADER
                                       and rep.status().leader_ready), None), 20, "a new ready leader")
        assert new.status().term > term
        assert not dropped, f"the followers' link was dropped during the failover by {dropped}"
        new.submit(b"after", outcomes.callback(1))
        outcomes.wait(2)
        assert outcomes.results[1][1] is None


def test_the_state_machine_learns_where_the_journal_ended_before_anything_is_applied(tmp_path: Any) -> None:
    """``journal_opened`` (the replay bound of BrokerStateMachine's `memory` topics): 0 for a new
    journal; after a restart, the last index the journal held, told before the first apply."""
    address = f"127.0.0.1:{free_port()}"

    def start() -> tuple[raft.PysyncobjReplicator, ChainStateMachine, list[int | None]]:
        sm = ChainStateMachine(tmp_path / "sm")
        told_at_first_apply: list[int | None] = []
        stock_apply = sm.apply

        def apply(index: int, command: bytes | memoryview) -> object:
            if not told_at_first_apply:
                told_at_first_apply.append(sm.journal_last_index)
            return stock_apply(index, command)

        sm.apply = apply  # type: ignore[method-assign]
        rep = raft.PysyncobjReplicator(address, [], tmp_path / "raft", sm, FAST_OPTIONS)
        rep.start()
        wait_until(lambda: rep.status().role == "leader", 5, "single-node election")
        return rep, sm, told_at_first_apply

    rep, sm, _ = start()
    assert sm.journal_last_index == 0
    outcomes = Outcomes()
    for i in range(5):
        rep.submit(b"c%d" % i, outcomes.callback(i))
    outcomes.wait(5)
    assert rep._node is not None
    journal = rep._node.journal
    assert journal is not None
    last = journal[-1][1]
    assert last >= 5 and rep.status().applied_index == last
    rep.close()
    sm.close()
    rep, sm, told_at_first_apply = start()
    try:
        assert sm.journal_last_index == last
        # the entries it had applied are passed without an apply (_pass_entries_applied_before): a new one
        outcomes = Outcomes()
        rep.submit(b"after", outcomes.callback(0))
        outcomes.wait(1)
        wait_until(lambda: bool(told_at_first_apply), 5, "an apply after the restart")
        assert told_at_first_apply == [last]
    finally:
        rep.close()
        sm.close()


_Node = tuple[raft.PysyncobjReplicator, ChainStateMachine]


@contextlib.contextmanager
def _three_nodes(tmp_path: Any, options: RaftOptions) -> Iterator[tuple[list[_Node], raft.PysyncobjReplicator]]:
    """Three in-process replicators on free ports with ``options``: (every node and its state machine,
    the ready leader); all closed on the way out."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes: list[_Node] = []
    try:
        for i, address in enumerate(addresses):
            sm = ChainStateMachine(tmp_path / f"n{i}" / "sm")
            rep = raft.PysyncobjReplicator(address, addresses, tmp_path / f"n{i}" / "raft", sm, options)
            nodes.append((rep, sm))
            rep.start()
        leader = wait_until(lambda: next((rep for rep, _ in nodes if rep.status().role == Role.LEADER
                                          and rep.status().leader_ready), None), 20, "a ready leader")
        yield nodes, leader
    finally:
        for rep, sm in nodes:
            rep.close()
            sm.close()


def test_commands_queued_together_reach_each_follower_in_one_message(tmp_path: Any) -> None:
    """The leader appends every command queued since its last tick, then sends once: ten commands
    queued together reach each follower as one AppendEntries carrying all ten (stock pysyncobj sent
    one message per command per follower), and every node applies the same history.

    The leader drains its queue for at most ``append_entries_period_s`` per tick: a long period keeps a
    preempted drain (a loaded machine) from leaving some of the ten to the next tick, and long
    election timeouts keep the leader in place. The first message may also carry earlier entries
    the follower still lacks (the term's no-op)."""
    options = RaftOptions(raft_min_timeout_s=2.0, raft_max_timeout_s=3.0, append_entries_period_s=0.5)
    with _three_nodes(tmp_path, options) as (nodes, leader):
        assert leader._node is not None
        transport = leader._node._SyncObj__transport
        carried: list[tuple[str, list[int]]] = []  # (follower, indexes) of each AppendEntries with entries
        stock_send = transport.send

        def send(node: Any, message: Any) -> Any:
            if isinstance(message, dict) and message.get("type") == "append_entries" and message.get("entries"):
                carried.append((str(node.id), [entry[1] for entry in message["entries"]]))
            return stock_send(node, message)

        transport.send = send  # pysyncobj looks the method up per call
        outcomes = Outcomes()
        queued = threading.Event()

        def queue_ten() -> None:  # on the replication thread, between two ticks' appends
            for i in range(10):
                leader.submit(b"together-%d" % i, outcomes.callback(i))
            queued.set()

        leader._tick_calls.append(queue_ten)
        assert queued.wait(10)
        wait_until(lambda: len(outcomes.results) == 10, 10, "ten commits")
        indexes = sorted(result["index"] for result, error in outcomes.results.values()
                         if error is None and isinstance(result, dict))
        assert len(indexes) == 10 and indexes == list(range(indexes[0], indexes[0] + 10))
        followers = {rep.status().self_address for rep, _ in nodes} - {leader.status().self_address}
        for follower in followers:
            messages = [ixs for to, ixs in carried if to == follower and set(ixs) & set(indexes)]
            assert messages and set(indexes) <= set(messages[0]), f"{follower} got the ten entries as {messages}"
        wait_until(lambda: all(sm.applied_index() >= indexes[-1] for _, sm in nodes), 10, "every node applied")
        assert len({sm.chain() for _, sm in nodes}) == 1


@pytest.mark.parametrize("delay_s", [0.0, 0.3])
def test_followers_learn_a_commit_from_the_next_append_entries_or_after_the_notice_delay(
        tmp_path: Any, delay_s: float) -> None:
    """``commit_notice_delay_s``: after a commit the leader sends no commit-only AppendEntries while
    its next message (the next command's) would carry the commit index anyway; if none goes out within
    the delay, it sends one then, so idle followers still apply the last command well before the next
    heartbeat. With 0 (pysyncobj's behaviour) every apply is followed at once by a commit-only message
    to each follower: a closed loop of 40 commands makes at least one per command.

    The heartbeat period is long (1 s), so heartbeats add at most a few commit-only messages to the
    count, and the followers' apply of the last command cannot be a heartbeat's doing."""
    options = RaftOptions(raft_min_timeout_s=4.0, raft_max_timeout_s=6.0, append_entries_period_s=1.0,
                          connection_timeout_s=6.0, commit_notice_delay_s=delay_s)
    commands = 40
    with _three_nodes(tmp_path, options) as (nodes, leader):
        assert leader._node is not None
        transport = leader._node._SyncObj__transport
        notices: list[tuple[float, int]] = []  # (when, commit index) of each commit-only AppendEntries
        stock_send = transport.send

        def send(node: Any, message: Any) -> Any:
            if isinstance(message, dict) and message.get("type") == "append_entries" \
                    and "prevLogIdx" in message and not message.get("entries") and "transmission" not in message:
                notices.append((time.monotonic(), message["commit_index"]))
            return stock_send(node, message)

        transport.send = send  # pysyncobj looks the method up per call
        outcomes = Outcomes()
        for i in range(commands):  # a closed loop: each command once the previous one is committed
            leader.submit(b"loop-%d" % i, outcomes.callback(i))
            outcomes.wait(i + 1)
        committed_at = time.monotonic()
        assert all(error is None for _, error in outcomes.results.values()), outcomes.results
        last = outcomes.index(commands - 1)
        during = len(notices)
        wait_until(lambda: all(sm.applied_index() >= last for _, sm in nodes), 10, "every node applied the last")
        applied_after_s = time.monotonic() - committed_at
        if delay_s == 0:
            assert during >= commands, f"{during} commit-only messages for {commands} commands"
        else:
            assert during < commands // 2, f"{during} commit-only messages for {commands} commands"
            # the followers heard of the last commit from the notice, not from a heartbeat a second later
            assert applied_after_s < 0.9, f"followers applied the last command {applied_after_s:.2f} s after it"
            told = [at for at, commit in notices if commit >= last]
            assert told and told[0] - committed_at >= delay_s / 2, (told[:1], committed_at)
        assert len({sm.chain() for _, sm in nodes}) == 1


def test_a_message_larger_than_the_socket_buffer_goes_out_whole_without_waiting_for_a_heartbeat(tmp_path: Any) -> None:
    """A command larger than what a socket's send buffer takes at once still reaches the followers at
    once: the leader watches for write events while bytes are left and sends the rest as the
    follower reads. pysyncobj stopped watching after a connection's first send, so the rest of a
    large message waited for the leader's next send to that follower, one heartbeat
    (``append_entries_period_s``) per send buffer's worth; with 64 KiB socket buffers, a 0.5 s period
    and a 4 MiB command, a commit took tens of seconds, or never came as the followers, hearing no
    heartbeat behind the stuck message, called elections."""
    options = RaftOptions(raft_min_timeout_s=2.0, raft_max_timeout_s=3.0, append_entries_period_s=0.5,
                          socket_send_buffer_bytes=64 * 1024, socket_receive_buffer_bytes=64 * 1024)
    with _three_nodes(tmp_path, options) as (nodes, leader):
        outcomes = Outcomes()
        big = bytes(range(256)) * (4 * 1024 * 4)  # 4 MiB
        leader.submit(big, outcomes.callback(0))
        # Well under the 16 s a send-buffer's worth per heartbeat would take, and under an election
        # timeout from the submit, so the command is committed by the leader it was submitted to.
        wait_until(lambda: 0 in outcomes.results, 6, "the 4 MiB command committed")
        result, error = outcomes.results[0]
        assert error is None and isinstance(result, dict), (result, error)
        wait_until(lambda: all(sm.applied_index() >= result["index"] for _, sm in nodes), 6, "every node applied it")
        assert len({sm.chain() for _, sm in nodes}) == 1


@pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 65_537, 1024 * 1024 + 3])
def test_a_regular_entry_is_byte_for_byte_what_pysyncobj_s_wrapper_writes(size: int) -> None:
    """The leader builds each entry itself (the command copied once): the bytes must be exactly those
    of pysyncobj's ``@replicated`` wrapper, which every node, old or new, can apply; the fsync flag
    is read from them as before; and the apply's own parse takes the command back out of exactly
    the large ones, calling one of the given methods."""
    command = bytes(range(256)) * (size // 256) + b"\x80" * (size % 256)
    plain_id, synced_id = (raft_node._RaftNode._METHOD_IDS[m] for m in (raft._APPLY_METHOD, raft._SYNCED_APPLY_METHOD))
    for method_id in (plain_id, synced_id):
        entry = raft_node.regular_entry(method_id, command)
        assert entry == b"\x00" + pickle.dumps((method_id, (command,)), protocol=5)
        for cuts in ((), (0,), (1, size // 3, size // 2), (size,)):  # the command in pieces, joined into the entry
            bounds = sorted([0, *cuts, size])
            pieces = CommandPieces.of([command[a:b] for a, b in itertools.pairwise(bounds)])
            assert raft_node.regular_entry(method_id, pieces) == entry
        assert raft.command_needs_sync(entry, synced_id) == (method_id == synced_id)
        taken = raft_node.entry_command(entry, (plain_id, synced_id))
        assert taken == (command if size >= 65_536 else None)
        assert taken is None or (type(taken) is memoryview and taken.obj is entry and taken.readonly)  # not copied
        assert raft_node.entry_command(entry, (max(plain_id, synced_id) + 1,)) is None  # another method
    if size >= 65_536:
        entry = raft_node.regular_entry(plain_id, command)
        for bad in (entry[:-1], entry + b".", entry[:6] + (size + 1).to_bytes(4, "little") + entry[10:],
                    b"\x01" + entry[1:], entry[:-2] + b"\x85."):
            assert raft_node.entry_command(bad, (plain_id, synced_id)) is None  # left to pysyncobj


def test_large_commands_are_applied_on_every_node_without_pysyncobj_s_unpickling(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large commands, plain and synced, reach every node's state machine as the bytes submitted,
    through the node's own parse of the entry; small ones and every other entry still go through
    pysyncobj's apply (its unpickling copied a 1 MiB command twice)."""
    stock = raft_node.SyncObj._SyncObj__doApplyCommand
    stock_regular: list[int] = []  # sizes of the regular entries pysyncobj's apply unpickled

    def counting(self: Any, command: bytes) -> object:
        if command[:1] == b"\x00":
            stock_regular.append(len(command))
        return stock(self, command)

    monkeypatch.setattr(raft_node.SyncObj, "_SyncObj__doApplyCommand", counting)
    options = RaftOptions(raft_min_timeout_s=2.0, raft_max_timeout_s=3.0)
    with _three_nodes(tmp_path, options) as (nodes, leader):
        commands = [bytes([i]) * (200_000 + i) for i in range(3)] + [b"small-%d" % i for i in range(2)]
        outcomes = Outcomes()
        for i, command in enumerate(commands):
            leader.submit(command, outcomes.callback(i), sync=i % 2 == 1)
        wait_until(lambda: len(outcomes.results) == len(commands), 10, "every command committed")
        last = max(result["index"] for result, _ in outcomes.results.values() if isinstance(result, dict))
        wait_until(lambda: all(sm.applied_index() >= last for _, sm in nodes), 10, "every node applied them")
        assert len({sm.chain() for _, sm in nodes}) == 1
        applied = {r.command_id for r in read_records(nodes[0][1].log_path) if r.kind == "A"}
        assert {command_id(c) for c in commands} <= applied
        assert stock_regular and max(stock_regular) < 1000, stock_regular  # only the small ones, on each node
