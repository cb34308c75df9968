"""Network fabrics that place a drill's nodes and cut, split and degrade the links between them.

A :class:`Fabric` decides each node's host address, wraps its command and environment, and
injects link faults between nodes (never between the drill's clients and the nodes):
- ``netns``: each node in a network namespace of its own (``rbchaos-<run>-nK``) on a bridge in a
  hub namespace, reached from the drill over one veth pair; faults are iptables rules inside the
  node namespaces (drop, or drop with a probability). Needs root, ``ip`` and ``iptables``.
- ``proxy``: nodes on loopback; every Raft link goes through a TCP proxy of the drill's (the node
  is started through ``chaos.node_shim``, which makes pysyncobj dial the link's proxy); faults
  cut a link's connections, or stall its bytes with a probability (TCP hides loss as delay).
- ``loopback``: plain loopback, no link faults (process faults only).
Every fabric undoes everything in :meth:`Fabric.close`; ``chaos.net.netns.cleanup_all`` removes
what a killed drill left behind.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Protocol


class Fabric(Protocol):
    """Where nodes live and how their links fail."""

    name: str
    supports_link_faults: bool

    def host(self, i: int) -> str:
        """The IP address node ``i`` binds its gRPC, Raft and metrics ports to."""
        ...

    def wrap(self, i: int, command: list[str]) -> list[str]:
        """Node ``i``'s command line as the fabric must run it."""
        ...

    def env(self, i: int) -> dict[str, str]:
        """Extra environment of node ``i``."""
        ...

    def prepare(self, raft_addresses: Sequence[str]) -> None:
        """Called once before the first node starts, with every node's Raft address."""
        ...

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Cut every link between nodes of different groups (a node in no group keeps its links)."""
        ...

    def cut(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Cut the links between these pairs of nodes (both directions)."""
        ...

    def loss(self, probability: float, nodes: Sequence[int]) -> None:
        """Lose (netns) or stall (proxy) this share of the packets between these nodes."""
        ...

    def heal(self) -> None:
        """Undo every link fault."""
        ...

    def close(self) -> None:
        """Undo everything the fabric created."""
        ...


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be used here, or ``None`` when they can."""
    import os

    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (apt-get install iproute2 iptables)"
    return None


def make_fabric(kind: str, nodes: int, run_id: str, seed: int = 0) -> Fabric:
    """``netns``, ``proxy``, ``loopback`` or ``auto`` (netns when possible, else proxy); ``seed``
    drives the proxies' stalls."""
    from chaos.net.loopback import LoopbackFabric
    from chaos.net.netns import NetnsFabric
    from chaos.net.proxy import ProxyFabric

    if kind == "auto":
        kind = "netns" if netns_unavailable() is None else "proxy"
    if kind == "netns":
        why = netns_unavailable()
        if why is not None:
            raise RuntimeError(f"network namespaces are not available: {why}")
        return NetnsFabric(nodes, run_id)
    if kind == "proxy":
        return ProxyFabric(nodes, run_id, seed)
    if kind == "loopback":
        return LoopbackFabric()
    raise ValueError(f"unknown network {kind!r} (auto, netns, proxy, loopback)")
