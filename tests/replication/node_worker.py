"""One raft node in its own process, driven by JSON lines on stdin; replies are JSON lines on stdout.

Run by ``cluster.py``: ``python node_worker.py --self ADDR --peers A,B,C --dir DIR [--options JSON]
[--instrument] [--apply-delay-ms MS]``. ``RAFTBROKER_PYSYNCOBJ_PATCHES_OFF`` in the environment switches patches off.
With ``--instrument`` the node counts truncations of log entries it had already acknowledged to the
leader of the current term (a leader never overwrites its own entries, so any is a safety bug).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from chain_sm import ChainStateMachine

from broker.replication import ReplicationError, raft
from broker.replication._patches import active_patches

_out_lock = threading.Lock()
counters: Counter[str] = Counter()


def reply(message: dict[str, Any]) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def instrument() -> None:
    """Wrap the follower's ack and truncate paths (both stock and patched code call them)."""
    node_class = raft._RaftNode
    original_send = node_class._SyncObj__sendNextNodeIdx
    original_delete = node_class._SyncObj__deleteEntriesFrom
    acked = {"term": -1, "index": 0}

    def send(self: Any, node: Any, reset: bool = False, nextNodeIdx: int | None = None, success: bool = False) -> Any:
        if success and nextNodeIdx is not None:
            if acked["term"] != self.raftCurrentTerm:
                acked.update(term=self.raftCurrentTerm, index=0)
            acked["index"] = max(acked["index"], nextNodeIdx - 1)
        return original_send(self, node, reset=reset, nextNodeIdx=nextNodeIdx, success=success)

    def delete(self: Any, from_index: int) -> Any:
        counters["truncations"] += 1
        if acked["term"] == self.raftCurrentTerm and from_index <= acked["index"]:
            counters["acked_truncations"] += 1
            counters["acked_entries_truncated"] += acked["index"] - from_index + 1
        return original_delete(self, from_index)

    node_class._SyncObj__sendNextNodeIdx = send  # type: ignore[method-assign]
    node_class._SyncObj__deleteEntriesFrom = delete


class ErrorCounter(logging.Handler):
    """Counts errors pysyncobj logs (e.g. an exception escaping the tick), by exception type."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            counters["tick_errors"] += 1
            if record.exc_info and record.exc_info[0] is not None:
                kind = record.exc_info[0]
                counters[f"error:{kind.__module__}.{kind.__qualname__}"] += 1


class Tally:
    """Counts callback outcomes of one request and replies once all have arrived."""

    def __init__(self, request_id: int, expected: int) -> None:
        self.request_id = request_id
        self.expected = expected
        self.ok = 0
        self.unapplied = 0  # successes whose apply returned nothing (the state machine skipped the index)
        self.errors: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.started = time.monotonic()

    def callback(self, result: object, error: ReplicationError | None) -> None:
        with self.lock:
            if error is None:
                self.ok += 1
                self.unapplied += result is None
            else:
                self.errors[error.reason.value] += 1
            finished = self.ok + sum(self.errors.values()) == self.expected
        if finished:
            self.done.set()
            elapsed = time.monotonic() - self.started
            reply({"id": self.request_id, "ok": self.ok, "unapplied": self.unapplied, "errors": dict(self.errors),
                   "elapsed": elapsed})


def make_command(prefix: str, seq: int, size: int) -> bytes:
    head = f"{prefix}-{seq}|".encode()
    return head + os.urandom(max(0, size - len(head)))


def run_load(rep: raft.PysyncobjReplicator, req: dict[str, Any]) -> None:
    """Keep ``inflight`` commands outstanding for ``seconds``; reply with the outcome counts."""
    inflight = threading.BoundedSemaphore(req["inflight"])
    outcome: Counter[str] = Counter()
    lock = threading.Lock()

    def callback(result: object, error: ReplicationError | None) -> None:
        with lock:
            outcome["ok" if error is None else error.reason.value] += 1
        inflight.release()

    deadline = time.monotonic() + req["seconds"]
    seq = 0
    while time.monotonic() < deadline:
        if not inflight.acquire(timeout=0.1):
            continue
        seq += 1
        rep.submit(make_command(req["prefix"], seq, req["size"]), callback, sync=req.get("sync", False))
    for _ in range(req["inflight"]):  # wait (bounded) for the outstanding ones
        if not inflight.acquire(timeout=5):
            break
    with lock:
        reply({"id": req["id"], "submitted": seq, "outcome": dict(outcome)})


def run_latency(rep: raft.PysyncobjReplicator, req: dict[str, Any]) -> None:
    """Submit ``count`` commands one at a time; reply with each commit latency in seconds."""
    latencies = []
    for seq in range(req["count"]):
        done = threading.Event()
        started = time.monotonic()

        def committed(_result: object, _error: ReplicationError | None, done: threading.Event = done) -> None:
            done.set()

        rep.submit(make_command(req["prefix"], seq, req["size"]), committed, sync=req.get("sync", False))
        if not done.wait(5):
            break
        latencies.append(time.monotonic() - started)
        time.sleep(req.get("pause_s", 0.01))
    reply({"id": req["id"], "latencies": latencies})


def handle(rep: raft.PysyncobjReplicator, sm: ChainStateMachine, req: dict[str, Any]) -> bool:
    op = req["op"]
    if op == "status":
        st = rep.status()
        reply({
            "id": req["id"], "role": st.role.value, "term": st.term, "commit_index": st.commit_index,
            "applied_index": st.applied_index, "leader": st.leader_address, "has_quorum": st.has_quorum,
            "leader_ready": st.leader_ready,
            "sm_applied": sm.applied_index(), "sm_chain": sm.chain(), "sm_count": sm.applied_count,
            "sm_skipped": sm.skipped, "pending": rep.pending_count(), "counters": dict(counters),
            "patches": sorted(active_patches()),
            "fsyncs": journal.fsyncs if (journal := rep._node.journal) is not None else None,  # type: ignore[union-attr]
            "fsync_seconds": journal.fsync_seconds if journal is not None else None,
            "read_backs": journal.read_backs if journal is not None else None,
            "snapshots_taken": rep._counters.snapshot().snapshot_take.count,
            "compactions_triggered": rep._node.compactions_triggered,  # type: ignore[union-attr]
            "sm_discarded": sm.discarded,
        })
    elif op == "submit":
        tally = Tally(req["id"], req["count"])
        for seq in range(req["count"]):
            rep.submit(make_command(req["prefix"], seq, req["size"]), tally.callback, sync=req.get("sync", False))
    elif op == "load":
        threading.Thread(target=run_load, args=(rep, req), daemon=True).start()
    elif op == "latency":
        threading.Thread(target=run_latency, args=(rep, req), daemon=True).start()
    elif op in ("add_member", "remove_member"):
        def changed(result: object, error: ReplicationError | None, request_id: int = req["id"]) -> None:
            reply({"id": request_id, "ok": error is None, "error": None if error is None else str(error)})
        getattr(rep, op)(req["address"], changed)
    elif op == "members":
        reply({"id": req["id"], "members": rep.members()})
    elif op == "compact":
        rep.force_compaction()
        reply({"id": req["id"]})
    elif op == "transfer":
        reply({"id": req["id"], "sent": rep.transfer_leadership(req.get("target"))})
    elif op == "socket_buffers":  # the kernel's SO_SNDBUF / SO_RCVBUF of each Raft connection
        transport = rep._node._SyncObj__transport  # type: ignore[union-attr]
        sockets = [conn._TcpConnection__socket for conn in
                   [*transport._connections.values(), *transport._unknownConnections]]
        reply({"id": req["id"], "buffers": [[sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                                             sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)]
                                            for sock in sockets if sock is not None]})
    elif op == "entry_size":
        reply({"id": req["id"], "size": rep.log_entry_size_bytes(req["index"])})
    elif op == "exit":
        rep.close()
        reply({"id": req["id"]})
        return False
    else:
        reply({"id": req["id"], "error": f"unknown op {op}"})
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--self", dest="self_address", required=True)
    parser.add_argument("--peers", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--instrument", action="store_true")
    parser.add_argument("--apply-delay-ms", type=float, default=0.0, help="sleep this long in each apply")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pysyncobj").addHandler(ErrorCounter())
    if args.instrument:
        instrument()
    directory = Path(args.dir)
    sm = ChainStateMachine(directory / "sm")
    sm.apply_delay_s = args.apply_delay_ms / 1000
    options = raft.RaftOptions(**json.loads(args.options))
    peers = [p for p in args.peers.split(",") if p]
    rep = raft.PysyncobjReplicator(args.self_address, peers, directory / "raft", sm, options)
    rep.start()
    reply({"event": "ready", "pid": os.getpid()})
    for line in sys.stdin:
        if not handle(rep, sm, json.loads(line)):
            break
    else:
        rep.close()


if __name__ == "__main__":
    main()
