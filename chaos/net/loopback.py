"""The plain fabric: nodes on 127.0.0.1, no link faults (process and disk faults only)."""

from __future__ import annotations

from collections.abc import Sequence


class LoopbackFabric:
    """Nodes as ``DevCluster`` runs them."""

    name = "loopback"
    supports_link_faults = False

    def host(self, i: int) -> str:
        return "127.0.0.1"

    def wrap(self, i: int, command: list[str]) -> list[str]:
        return command

    def env(self, i: int) -> dict[str, str]:
        return {}

    def prepare(self, raft_addresses: Sequence[str]) -> None:
        pass

    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        raise NotImplementedError("the loopback network cannot cut links")

    def cut(self, pairs: Sequence[tuple[int, int]]) -> None:
        raise NotImplementedError("the loopback network cannot cut links")

    def loss(self, probability: float, nodes: Sequence[int]) -> None:
        raise NotImplementedError("the loopback network cannot lose packets")

    def heal(self) -> None:
        pass

    def close(self) -> None:
        pass
