"""Nodes in network namespaces the drill creates; link faults as iptables rules inside them.

Layout for run ``R`` (6 hex digits) and subnet ``10.200.K.0/24`` (K chosen free at run time):
namespace ``rbchaos-R-hub`` holds bridge ``br0``; node i lives in ``rbchaos-R-n<i+1>`` with
``eth0`` = 10.200.K.<i+1> on a veth pair whose other end is on the bridge; the drill process
(root namespace) reaches the nodes through veth ``rbcR`` = 10.200.K.254, whose peer is on the
bridge too. Faults go to chain ``CHAOS`` (hooked into INPUT and OUTPUT) of the node namespaces and
only match node addresses, so the drill's clients always reach every node.

Deleting the namespaces removes everything (veths, bridge, rules); :func:`cleanup_all` does that
from a fresh process for every ``rbchaos-*`` namespace left by a killed drill, killing the
processes still inside them first.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import zlib
from collections.abc import Sequence

log = logging.getLogger(__name__)

NS_PREFIX = "rbchaos-"
LINK_PREFIX = "rbc"
_ROOT_LINK = re.compile(r"^rbc[0-9a-f]{6}$")
_CHAIN = "CHAOS"
_CMD_TIMEOUT_S = 20.0


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _used_subnets() -> set[int]:
    out = _run("ip", "-4", "-o", "addr", "show").stdout
    return {int(m) for m in re.findall(r"inet 10\.200\.(\d+)\.", out)}


class NetnsFabric:
    """A bridge of per-node namespaces; see the module docstring."""

    name = "netns"
    supports_link_faults = True

    def __init__(self, nodes: int, run_id: str) -> None:
        assert re.fullmatch(r"[0-9a-f]{6}", run_id), run_id
        assert 1 <= nodes <= 200
        self.nodes = nodes
        self.run_id = run_id
        self.hub = f"{NS_PREFIX}{run_id}-hub"
        self.root_link = f"{LINK_PREFIX}{run_id}"
        used = _used_subnets()
        start = zlib.crc32(run_id.encode()) % 250 + 1
        free = [k for k in [*range(start, 251), *range(1, start)] if k not in used]
        if not free:
            raise RuntimeError("no free 10.200.K.0/24 subnet")
        self.subnet = free[0]
        self._created: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def ns(self, i: int) -> str:
        return f"{NS_PREFIX}{self.run_id}-n{i + 1}"

    def host(self, i: int) -> str:
        return f"10.200.{self.subnet}.{i + 1}"

    @property
    def client_host(self) -> str:
        return f"10.200.{self.subnet}.254"

    def _build(self) -> None:
        _run("ip", "netns", "add", self.hub)
        self._created.append(self.hub)
        _run("ip", "-n", self.hub, "link", "set", "lo", "up")
        _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.hub, "link", "set", "br0", "up")
        for i in range(self.nodes):
            ns = self.ns(i)
            _run("ip", "netns", "add", ns)
            self._created.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", self.hub, "link", "add", f"v{i + 1}", "type", "veth", "peer", "name", "eth0",
                 "netns", ns)
            _run("ip", "-n", self.hub, "link", "set", f"v{i + 1}", "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.host(i)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            for table_cmd in (["-N", _CHAIN], ["-I", "INPUT", "-j", _CHAIN], ["-I", "OUTPUT", "-j", _CHAIN]):
                self._iptables(i, *table_cmd)
        _run("ip", "link", "add", self.root_link, "type", "veth", "peer", "name", "up0", "netns", self.hub)
        _run("ip", "-n", self.hub, "link", "set", "up0", "master", "br0", "up")
        _run("ip", "addr", "add", f"{self.client_host}/24", "dev", self.root_link)
        _run("ip", "link", "set", self.root_link, "up")

    def _iptables(self, i: int, *args: str) -> None:
        _run("ip", "netns", "exec", self.ns(i), "iptables", "-w", "5", *args)

    def wrap(self, i: int, command: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i), *command]

    def env(self, i: int) -> dict[str, str]:
        return {}

    def prepare(self, raft_addresses: Sequence[str]) -> None:
        pass

    # -- faults -----------------------------------------------------------------------------------
    def cut(self, pairs: Sequence[tuple[int, int]]) -> None:
        for a, b in pairs:
            for x, y in ((a, b), (b, a)):
                self._iptables(x, "-A", _CHAIN, "-s", self.host(y), "-j", "DROP")
                self._iptables(x, "-A", _CHAIN, "-d", self.host(y), "-j", "DROP")

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        side = {n: g for g, members in enumerate(groups) for n in members}
        self.cut([(a, b) for a in side for b in side if a < b and side[a] != side[b]])

    def loss(self, probability: float, nodes: Sequence[int]) -> None:
        assert 0.0 < probability < 1.0
        for x in nodes:
            for y in nodes:
                if x != y:
                    for direction in ("-s", "-d"):
                        self._iptables(x, "-A", _CHAIN, direction, self.host(y), "-m", "statistic", "--mode",
                                       "random", "--probability", f"{probability:.4f}", "-j", "DROP")

    def heal(self) -> None:
        for i in range(self.nodes):
            self._iptables(i, "-F", _CHAIN)

    def close(self) -> None:
        for ns in reversed(self._created):
            _kill_inside(ns)
            _run("ip", "netns", "del", ns, check=False)
        self._created.clear()
        if self.root_link in _root_links():
            _run("ip", "link", "del", self.root_link, check=False)


def _root_links() -> list[str]:
    out = _run("ip", "-o", "link", "show").stdout
    return [m.split("@")[0] for m in re.findall(r"^\d+: ([^:]+):", out, re.M)]


def _kill_inside(ns: str) -> None:
    """SIGKILL whatever still runs in one of our namespaces (a node a killed drill left behind)."""
    out = _run("ip", "netns", "pids", ns, check=False).stdout
    for pid in (int(p) for p in out.split() if p.isdigit()):
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def leftovers() -> list[str]:
    """Our namespaces and root links that exist now."""
    names = [line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(NS_PREFIX)] + [x for x in _root_links() if _ROOT_LINK.match(x)]


def cleanup_all(run_id: str | None = None) -> list[str]:
    """Remove every namespace and root link of one run (or of every run); return what was removed."""
    removed = []
    for name in leftovers():
        if run_id is not None and run_id not in name:
            continue
        if name.startswith(NS_PREFIX):
            _kill_inside(name)
            _run("ip", "netns", "del", name, check=False)
        else:
            _run("ip", "link", "del", name, check=False)
        removed.append(name)
    return removed
