"""A local cluster of broker nodes as separate OS processes (``raftbroker dev``, tests, benchmarks).

Node i (0-based) listens on 127.0.0.1: gRPC ``base+i``, Raft ``base+100+i``, metrics
``base+200+i``, and with ``http=True`` its HTTP gateway ``base+300+i``; its data lives in
``<data_dir>/n<i+1>`` and its output in ``<data_dir>/n<i+1>.log``.
Only the public gRPC API is used to watch the nodes.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from broker.client.errors import BrokerError
from broker.client.models import NodeInfo
from broker.client.probe import NodeProbe
from broker.client.security import ClientSecurity
from broker.security.devcerts import DevSecurity

RAFT_PORT_OFFSET = 100
METRICS_PORT_OFFSET = 200
HTTP_PORT_OFFSET = 300
STOP_TIMEOUT_S = 10.0


def _port_free(port: int) -> bool:
    """Whether a node could listen on ``port`` now. The probe binds as the nodes' servers do (gRPC,
    pysyncobj and the metrics server all set SO_REUSEADDR): without it, a connection on that port
    that a server closed first (TIME_WAIT, 60 s) made a free port look taken, and a CI run's
    ``add_node`` failed on a port an earlier test's cluster had served."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_EPHEMERAL_LOW_DEFAULT = 32768  # Linux's default start of the ports it gives outgoing connections
NODES_ADDED_MAX = 8  # add_node's headroom: nodes a cluster may grow by, kept below the ephemeral range


def ephemeral_port_low() -> int:
    """The first port the kernel may give an outgoing connection (or a bind to port 0)."""
    try:
        return int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW_DEFAULT


def free_base_port(nodes: int, attempts: int = 200) -> int:
    """A base port whose gRPC, Raft, metrics and HTTP ports are all free right now.

    Every port of the cluster, also those of up to :data:`NODES_ADDED_MAX` nodes added later, lies
    below the kernel's ephemeral range when it leaves room: a port in that range can be taken at any
    moment by some process's outgoing connection (a CI run once lost an added node's port that way)."""
    rng = random.Random()
    top = min(40000, ephemeral_port_low()) - HTTP_PORT_OFFSET - nodes - NODES_ADDED_MAX
    low = 20000 if top > 21000 else 1024
    for _ in range(attempts):
        base = rng.randrange(low, max(top, low + 1000))
        ports = [base + off + i for off in (0, RAFT_PORT_OFFSET, METRICS_PORT_OFFSET, HTTP_PORT_OFFSET)
                 for i in range(nodes)]
        if all(_port_free(p) for p in ports):
            return base
    raise RuntimeError("no free port range found")


class DevCluster:
    """Starts, watches, kills and restarts a local cluster."""

    def __init__(self, nodes: int, data_dir: Path, base_port: int | None = None,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                 security: DevSecurity | None = None, http: bool = False) -> None:
        """``security``: TLS, tokens and ACLs from these generated files (``raftbroker dev --secure``).
        ``http``: each node also serves the HTTP/JSON gateway (gRPC port + 300)."""
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.nodes = nodes
        self.data_dir = Path(data_dir).absolute()  # nodes may run from another directory (tree_by_node)
        self.base_port = base_port if base_port is not None else free_base_port(nodes)
        self.extra_args = list(extra_args)
        self.env = env
        self.env_by_node: dict[int, dict[str, str]] = {}  # more variables for node i only (on its next spawn)
        # node i runs the code of this source tree instead (its working directory and PYTHONPATH, on
        # its next spawn): a cluster of mixed code, as during an upgrade
        self.tree_by_node: dict[int, Path] = {}
        self.http = http  # also run each node's HTTP gateway (--http, port base+300+i)
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes
        self.security = security
        self._probe_security: ClientSecurity | None = None
        self._probes: dict[str, NodeProbe] = {}

    # -- addresses ---------------------------------------------------------------------------
    def node_id(self, i: int) -> str:
        return f"n{i + 1}"

    def grpc_address(self, i: int) -> str:
        return f"127.0.0.1:{self.base_port + i}"

    def raft_address(self, i: int) -> str:
        return f"127.0.0.1:{self.base_port + RAFT_PORT_OFFSET + i}"

    def metrics_address(self, i: int) -> str:
        return f"127.0.0.1:{self.base_port + METRICS_PORT_OFFSET + i}"

    def http_address(self, i: int) -> str:
        return f"127.0.0.1:{self.base_port + HTTP_PORT_OFFSET + i}"

    @property
    def addresses(self) -> list[str]:
        return [self.grpc_address(i) for i in range(self.nodes)]

    @property
    def pids(self) -> list[int | None]:
        return [p.pid if p is not None and p.poll() is None else None for p in self.procs]

    def log_path(self, i: int) -> Path:
        return self.data_dir / f"{self.node_id(i)}.log"

    def node_data_dir(self, i: int) -> Path:
        return self.data_dir / self.node_id(i)

    def command(self, i: int) -> list[str]:
        cmd = [sys.executable, "-m", "broker.cli.launch", "serve", "--node-id", self.node_id(i),
               "--data-dir", str(self.node_data_dir(i)), "--grpc", self.grpc_address(i),
               "--raft", self.raft_address(i), "--metrics", self.metrics_address(i)]
        for j in range(self.nodes):
            if j != i:
                cmd += ["--peer", f"{self.node_id(j)}={self.raft_address(j)}/{self.grpc_address(j)}"]
        if self.security is not None:
            cmd += self.security.node_args(self.node_id(i))
        if self.http:
            cmd += ["--http", self.http_address(i)]
        return cmd + self.extra_args

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> DevCluster:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.security is not None:
            self.security.ensure(self.addresses)
            cert, key = self.security.admin_cert()
            self._probe_security = ClientSecurity(ca_pem=self.security.ca_file.read_bytes(),
                                                  cert_pem=cert.read_bytes(), key_pem=key.read_bytes())
        for i in range(self.nodes):
            self.spawn(i)
        return self

    def add_node(self) -> int:
        """Spawn one more node (the next index) with every node of this cluster as its peer; it joins
        the Raft group when the leader is told to add it (``Client.add_node``). Returns its index."""
        i = self.nodes
        ports = [self.base_port + offset + i for offset in (0, RAFT_PORT_OFFSET, METRICS_PORT_OFFSET)]
        busy = [p for p in ports if not _port_free(p)]
        if busy:
            raise RuntimeError(f"ports {busy} for node {self.node_id(i)} are taken")
        self.nodes += 1
        self.procs.append(None)
        self.spawn(i)
        self.wait_answering(i)
        return i

    def wait_answering(self, i: int, timeout_s: float = 60.0) -> None:
        """Wait until node ``i`` answers ``NodeStatus`` (a leader adds only a node that answers)."""
        deadline = time.monotonic() + timeout_s
        while self.node_status(i) is None:
            if not self.alive(i):
                raise RuntimeError(f"node {self.node_id(i)} exited; see {self.log_path(i)}")
            if time.monotonic() >= deadline:
                raise TimeoutError(f"node {self.node_id(i)} did not answer within {timeout_s:g} s")
            time.sleep(0.1)

    def spawn(self, i: int) -> None:
        """Start node ``i`` (it must not be running)."""
        assert not self.alive(i), f"node {self.node_id(i)} is already running"
        env = dict(os.environ if self.env is None else self.env)
        env.update(self.env_by_node.get(i, {}))
        env.setdefault("PYTHONUNBUFFERED", "1")
        tree = self.tree_by_node.get(i)
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        with open(self.log_path(i), "ab") as out:
            self.procs[i] = subprocess.Popen(self.command(i), stdout=out, stderr=subprocess.STDOUT, cwd=tree,
                                             stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def alive(self, i: int) -> bool:
        proc = self.procs[i]
        return proc is not None and proc.poll() is None

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to node ``i``; for SIGKILL and SIGTERM, wait until it has exited."""
        proc = self.procs[i]
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def restart(self, i: int) -> None:
        self.kill(i)
        self.spawn(i)

    def stop(self) -> None:
        """SIGTERM every node, then SIGKILL whatever is still running after the timeout."""
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for probe in self._probes.values():
            probe.close()
        self._probes.clear()

    def __enter__(self) -> DevCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- status ------------------------------------------------------------------------------
    def probe(self, i: int) -> NodeProbe:
        """A :class:`~broker.client.probe.NodeProbe` of node ``i`` (asks only it; made once, closed by
        :meth:`stop`)."""
        address = self.grpc_address(i)
        probe = self._probes.get(address)
        if probe is None:
            probe = self._probes[address] = NodeProbe(address, security=self._probe_security)
        return probe

    def node_status(self, i: int, timeout_s: float = 1.0) -> NodeInfo | None:
        """Node ``i``'s own view, or ``None`` when it does not answer."""
        try:
            return self.probe(i).node_status(timeout_s=timeout_s)
        except BrokerError:
            return None

    def leader(self) -> int | None:
        """The index of the node that every running node agrees is the leader, if any."""
        views = [(i, self.node_status(i)) for i in range(self.nodes) if self.alive(i)]
        leaders = {v.id for _, v in views if v is not None and v.role == "leader"}
        if len(leaders) != 1 or any(v is None for _, v in views):
            return None
        leader_id = leaders.pop()
        if any(v is not None and v.leader_id != leader_id for _, v in views):
            return None
        return int(leader_id[1:]) - 1

    def _stated_error(self, i: int) -> str | None:
        """The one-line ``error: ...`` a node that refused to start printed last, if any."""
        try:
            lines = self.log_path(i).read_text(errors="replace").rstrip().splitlines()
        except OSError:
            return None
        return lines[-1] if lines and lines[-1].startswith("error: ") else None

    def wait_ready(self, timeout_s: float = 30.0) -> str:
        """Wait until the running nodes agree on a leader; return its gRPC address."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [i for i, p in enumerate(self.procs) if p is not None and p.poll() is not None
                    and p.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM)]
            if dead:
                reason = self._stated_error(dead[0])
                raise RuntimeError(f"node(s) {', '.join(self.node_id(i) for i in dead)} exited"
                                   + (f" ({self.node_id(dead[0])}: {reason})" if reason else "")
                                   + f"; see {self.data_dir}/*.log")
            leader = self.leader()
            if leader is not None:
                return self.grpc_address(leader)
            time.sleep(0.05)
        raise TimeoutError(f"no leader agreed on within {timeout_s:g} s; see {self.data_dir}/*.log")
