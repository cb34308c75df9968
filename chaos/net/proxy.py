"""The fallback fabric where namespaces are not available: a TCP proxy on every Raft link.

Nodes run on loopback through ``chaos.node_shim``, which makes pysyncobj dial, for peer j, the
proxy of link (i → j) instead of j's Raft address (``RAFTBROKER_CHAOS_DIAL``). pysyncobj keeps one
connection per pair of nodes, so the proxies see every byte between two nodes. A cut link closes
its connections and refuses new ones; "loss" stalls a chunk of bytes, with the given probability,
for 50-300 ms (TCP turns loss into delay; the proxy cannot drop bytes from a stream).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import threading
from collections.abc import Sequence
from pathlib import Path

_CHUNK_BYTES = 64 * 1024
_STALL_S = (0.05, 0.3)
_JOIN_S = 5.0  # close() waits this long for the accept thread
REPO_ROOT = Path(__file__).resolve().parents[2]


class _Link:
    """The shared state of the two directions between two nodes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocked = False
        self.loss = 0.0
        self.conns: set[socket.socket] = set()

    def drop_connections(self) -> None:
        with self.lock:
            conns, self.conns = list(self.conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()


class LinkProxy:
    """Listens on 127.0.0.1 (a free port) and forwards to ``target`` under ``link``'s faults."""

    def __init__(self, target: str, link: _Link, rng: random.Random) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.link = link
        self.rng = rng
        self.rng_lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.closed = False
        self.thread = threading.Thread(target=self._accept, name=f"proxy-{self.address}", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.link.blocked:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2.0)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.link.lock:
                self.link.conns.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _stall(self) -> float:
        if self.link.loss <= 0:
            return 0.0
        with self.rng_lock:
            return self.rng.uniform(*_STALL_S) if self.rng.random() < self.link.loss else 0.0

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(_CHUNK_BYTES)
                if not data or self.link.blocked:
                    break
                stall = self._stall()
                if stall:
                    threading.Event().wait(stall)  # the fault itself: hold these bytes back
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Stop accepting and wait for the accept thread. On Linux, closing a listening socket does not
        wake a thread blocked in its ``accept``; shutting it down first does (EINVAL)."""
        self.closed = True
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        self.thread.join(_JOIN_S)


class ProxyFabric:
    """Per-link TCP proxies on loopback; see the module docstring."""

    name = "proxy"
    supports_link_faults = True

    def __init__(self, nodes: int, run_id: str, seed: int = 0) -> None:
        self.nodes = nodes
        self.run_id = run_id
        self.rng = random.Random(seed)
        self.links = {(a, b): _Link() for a in range(nodes) for b in range(nodes) if a < b}
        self.proxies: dict[tuple[int, int], LinkProxy] = {}
        self.raft_addresses: list[str] = []

    def host(self, i: int) -> str:
        return "127.0.0.1"

    def prepare(self, raft_addresses: Sequence[str]) -> None:
        assert len(raft_addresses) == self.nodes
        self.raft_addresses = list(raft_addresses)
        for i in range(self.nodes):
            for j in range(self.nodes):
                if i != j:
                    link = self.links[(min(i, j), max(i, j))]
                    self.proxies[(i, j)] = LinkProxy(raft_addresses[j], link, random.Random(self.rng.getrandbits(32)))

    def wrap(self, i: int, command: list[str]) -> list[str]:
        assert command[1:3] == ["-m", "broker.cli.launch"], command
        return [command[0], "-m", "chaos.node_shim", *command[3:]]

    def env(self, i: int) -> dict[str, str]:
        assert self.proxies, "prepare() first"
        dial = {self.raft_addresses[j]: self.proxies[(i, j)].address for j in range(self.nodes) if j != i}
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
        return {"RAFTBROKER_CHAOS_DIAL": json.dumps(dial), "PYTHONPATH": path}

    def _link(self, a: int, b: int) -> _Link:
        return self.links[(min(a, b), max(a, b))]

    def cut(self, pairs: Sequence[tuple[int, int]]) -> None:
        for a, b in pairs:
            link = self._link(a, b)
            link.blocked = True
            link.drop_connections()

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        side = {n: g for g, members in enumerate(groups) for n in members}
        self.cut([(a, b) for a in side for b in side if a < b and side[a] != side[b]])

    def loss(self, probability: float, nodes: Sequence[int]) -> None:
        assert 0.0 < probability < 1.0
        for a in nodes:
            for b in nodes:
                if a < b:
                    self._link(a, b).loss = probability

    def heal(self) -> None:
        for link in self.links.values():
            link.blocked = False
            link.loss = 0.0

    def close(self) -> None:
        for proxy in self.proxies.values():
            proxy.close()
        for link in self.links.values():
            link.drop_connections()
        self.proxies.clear()
