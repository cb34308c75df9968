"""The membership nemesis against a fake cluster and SDK client: the order of its actions (remove,
stop and wipe only once removed, start, add), what it records, and that every way out leaves the
node a running member. The real thing runs in ``test_drills.py`` (``-k membership``)."""

from __future__ import annotations

import random
import signal
import threading
from pathlib import Path
from typing import Any, cast

import pytest

from broker.client import MemberNotFound, Unavailable
from chaos.cluster import ChaosCluster, NodeView
from chaos.history import History
from chaos.nemeses import Ctx, NemesisError, Step
from chaos.nemeses import membership as nemesis
from chaos.scenarios import NEMESES, SCENARIOS

pytestmark = [pytest.mark.unit]


class FakeCluster:
    """Three nodes whose membership the fake client changes; a member that runs is caught up."""

    def __init__(self, root: Path, leader: int = 0) -> None:
        self.nodes = 3
        self.root = root
        self.leader = leader
        self.members = {0, 1, 2}
        self.running = {0, 1, 2}
        self.events: list[str] = []
        for i in range(self.nodes):
            self.node_data_dir(i).mkdir(parents=True)
            (self.node_data_dir(i) / "raft.journal").write_bytes(b"old")

    def node_id(self, i: int) -> str:
        return f"n{i + 1}"

    def grpc_address(self, i: int) -> str:
        return f"127.0.0.1:{7000 + i}"

    def raft_address(self, i: int) -> str:
        return f"127.0.0.1:{7100 + i}"

    @property
    def addresses(self) -> list[str]:
        return [self.grpc_address(i) for i in range(self.nodes)]

    def node_data_dir(self, i: int) -> Path:
        return self.root / self.node_id(i)

    def log_path(self, i: int) -> Path:
        return self.root / f"{self.node_id(i)}.log"

    log_size = ChaosCluster.log_size  # the real readers of log_path
    log_since = ChaosCluster.log_since

    def alive(self, i: int) -> bool:
        return i in self.running

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        self.events.append(f"kill {self.node_id(i)} member={i in self.members}")
        self.running.discard(i)

    def spawn(self, i: int) -> None:
        self.events.append(f"spawn {self.node_id(i)}")
        self.running.add(i)
        with open(self.log_path(i), "a") as log:
            log.write("restored state machine from snapshot at index 7\n")

    def wait_answering(self, i: int, timeout_s: float = 60.0) -> None:
        if i not in self.running:
            raise RuntimeError(f"node {self.node_id(i)} exited")

    def current_leader(self) -> int | None:
        return self.leader

    def wait_leader(self, timeout_s: float, exclude: Any = ()) -> int | None:
        return None if self.leader in exclude else self.leader

    def view(self, i: int, timeout_s: float = 0.5) -> NodeView | None:
        if i not in self.running:
            return None
        applied = 10 if i in self.members else 0
        role = "leader" if i == self.leader else "follower"
        return NodeView(i, self.node_id(i), role, 1, self.node_id(self.leader), applied, applied)

    def wait_caught_up(self, i: int, index: int, timeout_s: float) -> bool:
        v = self.view(i)
        return v is not None and v.applied_index >= index


class FakeClient:
    """``remove_node`` / ``add_node`` on the fake cluster (a leader hands over first)."""

    def __init__(self, cluster: FakeCluster, fail_remove: bool = False) -> None:
        self.cluster = cluster
        self.fail_remove = fail_remove

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def _index(self, node_id: str) -> int:
        return int(node_id[1:]) - 1

    def remove_node(self, node_id: str) -> None:
        c, i = self.cluster, self._index(node_id)
        c.events.append(f"remove {node_id}")
        if self.fail_remove:
            raise Unavailable("UNAVAILABLE", "no leader answered")
        if i not in c.members:
            raise MemberNotFound("NOT_FOUND", f"{node_id} is not a member", reason="MEMBER_NOT_FOUND")
        if c.leader == i:
            c.leader = min(c.members - {i})
        c.members.discard(i)

    def add_node(self, node_id: str, raft_address: str, grpc_address: str) -> None:
        c, i = self.cluster, self._index(node_id)
        assert (raft_address, grpc_address) == (c.raft_address(i), c.grpc_address(i))
        c.events.append(f"add {node_id}")
        c.members.add(i)


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    c = FakeCluster(tmp_path)
    monkeypatch.setattr(nemesis, "Client", lambda addresses, **kw: FakeClient(c))
    monkeypatch.setattr(nemesis, "_members", lambda ctx, i: {c.node_id(j) for j in c.members})
    return c


def _ctx(c: FakeCluster) -> Ctx:
    return Ctx(cast(ChaosCluster, c), History(), threading.Event(), echo=lambda line: None)


def _step(target: str, k: int = 0) -> Step:
    return Step("membership", {"target": target, "k": k, "hold_s": 0.0, "quiet_s": 0.0})


def _recorded(ctx: Ctx) -> dict[str, Any]:
    """Every fault/note/heal value merged by kind (notes merged together)."""
    out: dict[str, Any] = {"fault-note": {}}
    for e in ctx.history.entries:
        if e.f == "fault-note":
            out["fault-note"].update(e.value)
        elif e.f in ("fault", "heal"):
            out[e.f] = e.value
    return out


def test_a_follower_is_removed_then_stopped_wiped_started_empty_and_added_back(cluster: FakeCluster) -> None:
    ctx = _ctx(cluster)
    nemesis.membership(ctx, _step("follower", k=1))
    assert cluster.events == ["remove n3", "kill n3 member=False", "spawn n3", "add n3"]
    assert not (cluster.node_data_dir(2) / "raft.journal").exists(), "its data was not wiped"
    assert cluster.members == {0, 1, 2} and cluster.running == {0, 1, 2}
    rec = _recorded(ctx)
    assert rec["fault"]["targets"] == ["n3"] and rec["fault"]["role"] == "follower"
    assert rec["heal"]["id"] == rec["fault"]["id"] and rec["heal"]["re_added"] == "n3"
    assert rec["fault-note"]["removed"] == "n3" and rec["fault-note"]["leader"] == "n1"
    assert rec["fault-note"]["caught_up_to"] == 10 and rec["fault-note"]["snapshot_restored"] == 7


def test_the_leader_is_resolved_when_the_fault_starts_and_another_node_leads_without_it(
        cluster: FakeCluster) -> None:
    cluster.leader = 1
    ctx = _ctx(cluster)
    nemesis.membership(ctx, _step("leader"))
    assert cluster.events == ["remove n2", "kill n2 member=False", "spawn n2", "add n2"]
    assert _recorded(ctx)["fault-note"]["leader"] == "n1"


def test_a_failed_removal_never_wipes_the_node_and_leaves_it_a_running_member(
        cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nemesis, "Client", lambda addresses, **kw: FakeClient(cluster, fail_remove=True))
    ctx = _ctx(cluster)
    with pytest.raises(NemesisError, match="RemoveNode n3 failed"):
        nemesis.membership(ctx, _step("follower", k=1))
    assert cluster.events == ["remove n3", "add n3"]
    assert (cluster.node_data_dir(2) / "raft.journal").exists()
    assert cluster.members == {0, 1, 2} and cluster.running == {0, 1, 2}
    assert "heal" in _recorded(ctx)


def test_an_abort_while_the_node_is_out_still_adds_it_back(cluster: FakeCluster) -> None:
    ctx = _ctx(cluster)

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    ctx.hold = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        nemesis.membership(ctx, _step("follower"))
    assert cluster.events == ["remove n2", "kill n2 member=False", "spawn n2", "add n2"]
    assert cluster.members == {0, 1, 2} and cluster.running == {0, 1, 2}
    assert "heal" in _recorded(ctx)


def test_a_node_that_is_not_added_back_is_reported(cluster: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nemesis, "_members", lambda ctx, i: {"n1", "n2"})  # n3 never shows as a member
    monkeypatch.setattr(nemesis, "MEMBERS_TIMEOUT_S", 0.0)
    ctx = _ctx(cluster)
    with pytest.raises(NemesisError, match="n3 is not in the configuration of n1 after AddNode"):
        nemesis.membership(ctx, _step("follower", k=1))
    rec = _recorded(ctx)
    assert "heal" not in rec and "rejoin_failed" in rec["fault-note"]


def test_the_schedule_is_drawn_from_the_seed() -> None:
    scenario = SCENARIOS["membership"]
    plans = [scenario.plan(random.Random(seed), 60.0, 3) for seed in (4, 4, 5)]
    assert plans[0] == plans[1] and plans[0] != plans[2]
    steps = plans[0] + plans[2]
    assert {s.kind for s in steps} == {"membership"} and NEMESES["membership"] is nemesis.membership
    assert {s.params["target"] for s in steps} == {"leader", "follower"}
    assert all(1.0 <= s.params["hold_s"] <= 4.0 for s in steps)
    assert scenario.node_env.get("RAFTBROKER_RAFT_COMPACTION_MIN_ENTRIES"), "catch-up must go through a snapshot"
