"""The router's connections to other clusters, and its lanes (``broker.leader.router``, "Lanes").

A :class:`Lane` is the thread that runs the routes to one remote cluster (one target address list);
its :class:`Connections` are the remote clusters it sends to, connected on first use. Closing them
(from any thread) cancels a call in flight and refuses new ones: that is how the router retires a
lane without waiting on a call that may block for seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from broker.core.errors import Unavailable
from broker.leader.route_copies import Copy


class RemoteCluster(Protocol):
    """Another cluster a route mirrors into (implemented with the SDK: ``broker.client.mirror``).
    Used by one lane thread; :meth:`close` may come from another thread and must make a call in
    flight end soon (with an error)."""

    def cluster_id(self) -> str: ...

    def append(self, topic: str, copies: Sequence[Copy]) -> object: ...

    def close(self) -> None: ...


class Connections:
    """The remote clusters one thread sends to, connected on first use; :meth:`close` (from any
    thread) closes them, which cancels a call in flight, and refuses new ones."""

    def __init__(self, factory: Callable[[list[str]], RemoteCluster]) -> None:
        self._factory = factory
        self._remotes: dict[tuple[str, ...], RemoteCluster] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, addresses: Sequence[str]) -> RemoteCluster:
        with self._lock:
            if self._closed:
                raise Unavailable("the router stopped sending to this cluster")
            remote = self._remotes.get(tuple(addresses))
            if remote is None:
                remote = self._remotes[tuple(addresses)] = self._factory(list(addresses))
            return remote

    def forget(self, addresses: Sequence[str]) -> None:
        """Drop the connection (and the remembered cluster id) of a failed route's remote cluster: the
        retry connects and identifies it again, so a cluster that came back, or another one now at
        those addresses, is seen as it is, not as it was (a route need not be re-created)."""
        with self._lock:
            remote = self._remotes.pop(tuple(addresses), None)
        if remote is not None:
            remote.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            remotes, self._remotes = list(self._remotes.values()), {}
        for remote in remotes:
            remote.close()


@dataclass
class Lane:
    """The thread that runs the routes to one remote cluster (``key``: its target addresses)."""

    key: tuple[str, ...]
    connections: Connections
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def retire(self) -> None:
        """Ask the thread to end, without waiting for it; a call in flight is cancelled."""
        self.stop.set()
        self.connections.close()
