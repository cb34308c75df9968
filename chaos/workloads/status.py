"""Status polls: one thread per node asks NodeStatus every ``period_s`` and records a ``status``
entry whenever the node's (role, term, leader) changes. The checker finds two leaders of one term
in these entries; the drill's operators see the elections."""

from __future__ import annotations

import threading

from chaos.cluster import ChaosCluster
from chaos.history import History


class StatusPoller:
    """Polls every node of ``cluster`` until :meth:`stop`."""

    def __init__(self, cluster: ChaosCluster, history: History, period_s: float = 0.1) -> None:
        self.cluster = cluster
        self.history = history
        self.period_s = period_s
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._poll, args=(i,), name=f"status-n{i + 1}", daemon=True)
                        for i in range(cluster.nodes)]

    def start(self) -> StatusPoller:
        for t in self.threads:
            t.start()
        return self

    def _poll(self, i: int) -> None:
        last: tuple[str, int, str] | None = None
        while not self.stopped.wait(self.period_s):
            v = self.cluster.view(i)
            if v is None:
                continue
            now = (v.role, v.term, v.leader_id)
            if now != last:
                last = now
                self.history.info(f"status-{v.id}", "status", {"node": v.id, "role": v.role, "term": v.term,
                                                               "leader_id": v.leader_id,
                                                               "commit_index": v.commit_index})

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(5)
