"""Membership changes: take a node out of the Raft group (``Admin.RemoveNode``), replace it with a
fresh machine, and add it back (``Admin.AddNode``) while the workload runs.

The node keeps its index, id and addresses, so every fabric works unchanged (its namespace, its
proxies). A removed node is stopped (SIGKILL) and its data directory deleted only once the
leader's configuration no longer holds it: wiping a member would make it forget its vote. It is
started empty with the current members as ``--peer`` (as it was started at first: the other
nodes), then added; it catches up from the leader's snapshot and log (docs/design/replication.md).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable

from broker.client import BrokerError, Client, MemberNotFound
from chaos.nemeses import RECOVERY_TIMEOUT_S, Ctx, NemesisError, Step

CLIENT_TIMEOUT_S = 5.0
MEMBERS_TIMEOUT_S = 10.0
_POLL_S = 0.1
_SNAPSHOT_RESTORED = re.compile(rb"restored state machine from snapshot at index (\d+)")


def membership(ctx: Ctx, step: Step) -> None:
    """Remove the ``target`` (leader | the ``k``-th follower), wipe it, keep it out for ``hold_s``,
    add it back and wait until it has caught up. The node is re-added (and running) whatever
    happens after its removal was asked for; :class:`NemesisError` when a step cannot be done."""
    target = resolve_target(ctx, step)
    fid = ctx.fault("membership", [target], change="remove, wipe, re-add", role=step.params["target"],
                    hold_s=step.params["hold_s"])
    log_mark = ctx.cluster.log_size(target)
    with Client(ctx.cluster.addresses, timeout_s=CLIENT_TIMEOUT_S, retry_deadline_s=RECOVERY_TIMEOUT_S) as client:
        problem: str | None = None
        try:
            _remove(ctx, client, fid, target)
            _stop_and_wipe(ctx, fid, target)
            log_mark = ctx.cluster.log_size(target)
            ctx.hold(float(step.params["hold_s"]))
        finally:
            problem = _rejoin(ctx, client, target)
            if problem is None:
                ctx.heal(fid, "membership", re_added=ctx.node(target))
            else:
                ctx.note(fid, rejoin_failed=problem)
    if problem is not None:
        raise NemesisError(problem)
    _await_caught_up(ctx, fid, target, log_mark)


def resolve_target(ctx: Ctx, step: Step) -> int:
    """The node a membership step changes: ``index`` when a compound step chose it already, else the
    leader or the ``k``-th follower, as of now."""
    if "index" in step.params:
        return int(step.params["index"])
    return ctx.leader() if step.params["target"] == "leader" else ctx.follower(int(step.params.get("k", 0)))


def _remove(ctx: Ctx, client: Client, fid: int, i: int) -> None:
    """RemoveNode ``i`` (a leader hands over first; the SDK follows the redirect) and wait until a
    leader of the others leads a configuration without it."""
    name = ctx.node(i)
    try:
        client.remove_node(name)
    except MemberNotFound:
        pass  # a retry of a removal that committed: confirmed below
    except BrokerError as err:
        raise NemesisError(f"RemoveNode {name} failed: {err}") from err
    leader = ctx.cluster.wait_leader(RECOVERY_TIMEOUT_S, exclude=[i])
    if leader is None:
        raise NemesisError(f"no leader without {name} within {RECOVERY_TIMEOUT_S:g} s of its removal")
    if not _await_members(ctx, leader, lambda members: name not in members):
        raise NemesisError(f"{name} is still in the configuration of {ctx.node(leader)} after RemoveNode")
    ctx.note(fid, removed=name, leader=ctx.node(leader))


def _stop_and_wipe(ctx: Ctx, fid: int, i: int) -> None:
    """SIGKILL node ``i`` (no longer a member) and delete its data directory: a fresh machine."""
    ctx.cluster.kill(i)
    data = ctx.cluster.node_data_dir(i)
    shutil.rmtree(data, ignore_errors=True)
    if data.exists():
        raise NemesisError(f"could not delete {data}")
    ctx.note(fid, stopped="SIGKILL", wiped=str(data))


def _rejoin(ctx: Ctx, client: Client, i: int) -> str | None:
    """Start node ``i`` if it is down and AddNode it (idempotent: a no-op for a member); return why
    it is not a running member afterwards (``None``: it is)."""
    name = ctx.node(i)
    if not ctx.cluster.alive(i):
        ctx.cluster.spawn(i)
    try:
        ctx.cluster.wait_answering(i, RECOVERY_TIMEOUT_S)  # a leader adds only a node that answers
    except (RuntimeError, TimeoutError) as err:
        return f"{name} did not start: {err}"
    try:
        client.add_node(name, ctx.cluster.raft_address(i), ctx.cluster.grpc_address(i))
    except BrokerError as err:
        return f"AddNode {name} failed: {err}"
    leader = ctx.cluster.wait_leader(RECOVERY_TIMEOUT_S)
    if leader is None:
        return f"no leader within {RECOVERY_TIMEOUT_S:g} s after adding {name}"
    if not _await_members(ctx, leader, lambda members: name in members):
        return f"{name} is not in the configuration of {ctx.node(leader)} after AddNode"
    return None


def _await_caught_up(ctx: Ctx, fid: int, i: int, log_mark: int) -> None:
    """Wait until node ``i`` has applied the leader's commit index (as of now); note whether it
    caught up through a snapshot."""
    leader = ctx.leader()
    view = ctx.cluster.view(leader)
    index = view.commit_index if view is not None else 0
    started = time.monotonic()
    caught_up = ctx.cluster.wait_caught_up(i, index, RECOVERY_TIMEOUT_S)
    restored = _SNAPSHOT_RESTORED.search(ctx.cluster.log_since(i, log_mark))
    ctx.note(fid, caught_up_to=index if caught_up else None, catch_up_s=round(time.monotonic() - started, 2),
             snapshot_restored=None if restored is None else int(restored.group(1)))
    if not caught_up:
        raise NemesisError(f"{ctx.node(i)} did not catch up to index {index} within {RECOVERY_TIMEOUT_S:g} s "
                           "after it was re-added")


def _await_members(ctx: Ctx, via: int, ok: Callable[[set[str]], bool]) -> bool:
    """Poll node ``via``'s configuration (ClusterStatus: node ids) until ``ok`` holds, bounded."""
    deadline = time.monotonic() + MEMBERS_TIMEOUT_S
    while True:
        members = _members(ctx, via)
        if members is not None and ok(members):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def _members(ctx: Ctx, i: int) -> set[str] | None:
    """The node ids of node ``i``'s current configuration, or ``None`` when it does not answer."""
    try:
        status = ctx.cluster.probe(i).cluster_status(timeout_s=CLIENT_TIMEOUT_S)
    except BrokerError:
        return None
    return {n.id for n in status.nodes}
