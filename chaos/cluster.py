"""A :class:`~broker.devcluster.DevCluster` whose nodes live on a :class:`~chaos.net.Fabric` and can
be paused; plus the status views the nemeses target nodes by.

Node i binds ``<fabric host i>:<base+i>`` (gRPC), ``+100`` (Raft) and ``+200`` (metrics). Outside
loopback a node needs ``--insecure`` and a Raft password (``RAFTBROKER_RAFT_PASSWORD``, with a
random per-cluster ``RAFTBROKER_RAFT_PASSWORD_SALT``); the drill gives them, because its namespaces
are reachable from this machine only.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.config import is_loopback
from broker.devcluster import METRICS_PORT_OFFSET, RAFT_PORT_OFFSET, DevCluster, free_base_port
from chaos.net import Fabric

NETNS_BASE_PORT = 7001  # inside its own namespace every port is free
STATUS_TIMEOUT_S = 0.5
NODE_DIR = "{node_data_dir}"  # in a ``node_env`` value: that node's data directory (per-node files)


@dataclass(frozen=True)
class NodeView:
    """One node's answer to NodeStatus."""

    index: int
    id: str
    role: str
    term: int
    leader_id: str
    commit_index: int
    applied_index: int


# Every drill node's housekeeping runs each second, not every 10 s: the leader raises the cluster's
# command format on its first housekeeping, and the apply digests (the ``apply-divergence`` check)
# begin only then; at the default period a drill of 20 s or less ended with that check skipped.
# A scenario's own ``node_env`` may set it otherwise (rolling-upgrade: 200 ms).
DRILL_NODE_ENV = {"RAFTBROKER_HOUSEKEEPING_PERIOD_MS": "1000"}


class ChaosCluster(DevCluster):
    """DevCluster on a fabric, with SIGSTOP/SIGCONT and status views that tolerate silent nodes.
    ``node_env`` is given to every node; ``{node_data_dir}`` (:data:`NODE_DIR`) in a value becomes
    the node's own data directory."""

    def __init__(self, nodes: int, data_dir: Path, fabric: Fabric, node_env: Mapping[str, str] | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        base = NETNS_BASE_PORT if fabric.name == "netns" else free_base_port(nodes)
        super().__init__(nodes, data_dir, base_port=base, extra_args=extra_args)
        self.fabric = fabric
        self.node_env = {**DRILL_NODE_ENV, **(node_env or {})}
        self.raft_password = secrets.token_hex(16)
        self.raft_password_salt = secrets.token_hex(16)
        self.paused: set[int] = set()
        fabric.prepare([self.raft_address(i) for i in range(nodes)])

    def _address(self, i: int, offset: int) -> str:
        return f"{self.fabric.host(i)}:{self.base_port + offset + i}"

    def grpc_address(self, i: int) -> str:
        return self._address(i, 0)

    def raft_address(self, i: int) -> str:
        return self._address(i, RAFT_PORT_OFFSET)

    def metrics_address(self, i: int) -> str:
        return self._address(i, METRICS_PORT_OFFSET)

    def command(self, i: int) -> list[str]:
        cmd = super().command(i)
        if not is_loopback(self.grpc_address(i)):
            cmd.append("--insecure")
        return self.fabric.wrap(i, cmd)

    def spawn(self, i: int) -> None:
        node_env = {k: v.replace(NODE_DIR, str(self.node_data_dir(i))) for k, v in self.node_env.items()}
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **node_env, **self.fabric.env(i)}
        if not is_loopback(self.raft_address(i)):
            env["RAFTBROKER_RAFT_PASSWORD"] = self.raft_password
            env["RAFTBROKER_RAFT_PASSWORD_SALT"] = self.raft_password_salt
        self.env = env
        self.paused.discard(i)
        super().spawn(i)

    def pause(self, i: int) -> None:
        """SIGSTOP node ``i`` (it keeps its sockets; peers and clients see silence)."""
        if self.alive(i):
            self.kill(i, signal.SIGSTOP)
            self.paused.add(i)

    def resume(self, i: int) -> None:
        if i in self.paused:
            self.paused.discard(i)
            if self.alive(i):
                self.kill(i, signal.SIGCONT)

    def stop(self) -> None:
        for i in list(self.paused):
            self.resume(i)
        super().stop()

    # -- node logs ---------------------------------------------------------------------------------
    def log_size(self, i: int) -> int:
        """How many bytes node ``i``'s log holds now (a mark for :meth:`log_since`)."""
        path = self.log_path(i)
        return path.stat().st_size if path.exists() else 0

    def log_since(self, i: int, offset: int) -> bytes:
        """What node ``i`` logged after ``offset`` (empty when its log cannot be read)."""
        try:
            with open(self.log_path(i), "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return b""

    # -- views ----------------------------------------------------------------------------------
    def view(self, i: int, timeout_s: float = STATUS_TIMEOUT_S) -> NodeView | None:
        """Node ``i``'s own status, or ``None`` if it is down, paused or does not answer in time."""
        if not self.alive(i) or i in self.paused:
            return None
        info = self.node_status(i, timeout_s)
        if info is None:
            return None
        return NodeView(i, info.id, info.role, info.term, info.leader_id, info.commit_index, info.applied_index)

    def views(self) -> list[NodeView]:
        return [v for v in (self.view(i) for i in range(self.nodes)) if v is not None]

    def current_leader(self) -> int | None:
        """The answering node that calls itself leader in the highest term (``None``: no leader)."""
        leaders = [v for v in self.views() if v.role == "leader"]
        return max(leaders, key=lambda v: v.term).index if leaders else None

    def wait_leader(self, timeout_s: float, exclude: Sequence[int] = ()) -> int | None:
        """Poll until a node outside ``exclude`` leads and a majority of answering nodes agree."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            views = self.views()
            leaders = [v for v in views if v.role == "leader" and v.index not in exclude]
            if leaders:
                top = max(leaders, key=lambda v: v.term)
                agree = [v for v in views if v.leader_id == top.id and v.term == top.term]
                if len(agree) * 2 > self.nodes:
                    return top.index
            time.sleep(0.05)
        return None

    def wait_converged(self, timeout_s: float) -> int | None:
        """Poll until every node answers and all applied the same index, at least the commit index
        each of them knows; return that index (``None`` on timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            views = self.views()
            if len(views) == self.nodes:
                applied = {v.applied_index for v in views}
                if len(applied) == 1 and max(v.commit_index for v in views) <= min(applied):
                    return applied.pop()
            time.sleep(0.1)
        return None

    def wait_caught_up(self, i: int, index: int, timeout_s: float) -> bool:
        """Poll until node ``i`` has applied ``index``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            v = self.view(i)
            if v is not None and v.applied_index >= index:
                return True
            time.sleep(0.05)
        return False
