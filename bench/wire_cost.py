"""In-process cost of the publish wire and handler (issue 15 item 3), in µs per record.

Four phases of one ``publish_batch`` of ``records`` records of ``size`` bytes (distinct random
values, no key: the SDK's default, a producer-session batch by range), each timed on its own:

- ``sdk_build``: the SDK turns the records into a ``PublishRequest`` and serializes it (what
  ``Client.publish_batch`` does before the call; gRPC serializes);
- ``server_in``: the server parses the request bytes (gRPC's deserializer), translates it
  (``services/wire``) and ``TopicLog`` prepares the command, up to the submit;
- ``server_out``: ``publish_response`` from the applied placements, serialized;
- ``sdk_parse``: the SDK parses the response bytes and builds its per-record results (all of them
  read, as a caller iterating the list would).

The replicator is the in-memory one (an apply on this thread); the apply is not timed. Figures are
medians of ``reps`` repetitions (wall time, one thread): compare ratios of one run on a loaded machine.
Runs against any commit of the tree (the old one builds and parses inline in ``client.py``).

    .venv/bin/python -m bench.wire_cost --records 1000 --size 100 --reps 30
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from broker.client import wire as client_wire
from broker.clock import ManualClock
from broker.core.members import Peer
from broker.core.state_machine import BrokerStateMachine
from broker.leader.changes import Changes
from broker.leader.submitter import CommandSubmitter, PeerDirectory
from broker.leader.topic_log import Limits, TopicLog
from broker.replication import CommandPieces
from broker.replication.memory import InMemoryReplicator
from broker.services import wire as server_wire
from broker.storage.memory import MemoryStore
from broker.v1 import broker_pb2, internal_pb2


class _TimedSubmitter(CommandSubmitter):
    """The real submitter, noting when the command is handed over (the end of ``server_in``)."""

    submitted_at = 0.0

    def submit(self, command: internal_pb2.Command | bytes | CommandPieces, *, sync: bool = False) -> object:
        self.submitted_at = time.perf_counter()
        return super().submit(command, sync=sync)


def _sdk_build(records: list[Any], session: tuple[str, int]) -> bytes:
    builder: Callable[..., Any] | None = getattr(client_wire, "publish_request", None)
    if builder is not None:  # the lean wire: one shared builder
        call = builder("t", records, None, None)
        if hasattr(call, "data"):  # the request as bytes joined once (2026-11-28)
            return bytes(call.data(*session))
        request = call.request
    else:  # before: built inline in client.py
        batch = [client_wire.outgoing(r) for r in records]
        ids = client_wire.msg_ids(batch, None, None)
        keys = [""] * len(batch)
        request = broker_pb2.PublishRequest(
            topic="t", records=[client_wire.publish_record(r, k, m) for r, k, m in zip(batch, keys, ids, strict=True)])
    request.dedup_id, request.first_msg_id = session
    return request.SerializeToString()


def _sdk_parse(data: bytes, count: int) -> int:
    response = broker_pb2.PublishResponse.FromString(data)
    parse = getattr(client_wire, "publish_results", None)
    if parse is not None:
        results = parse(response, count, None)
    else:
        results = [client_wire.publish_result(r, "") for r in response.results]
    return sum(r.offset for r in results)  # every result read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()

    state = BrokerStateMachine(MemoryStore(), Changes())
    replicator = InMemoryReplicator(state)
    replicator.start()
    submitter = _TimedSubmitter(replicator, PeerDirectory([Peer("n1", "memory:0", "127.0.0.1:1")]), 5.0)
    log = TopicLog(state, submitter, Limits(), "c/n1", ManualClock())
    log.create_topic(internal_pb2.TopicConfig(name="t", partitions=args.partitions))
    rng = random.Random(7)
    phases: dict[str, list[float]] = {"sdk_build": [], "server_in": [], "server_out": [], "sdk_parse": []}
    lean = getattr(log, "publish_placed", None)
    respond: Any = server_wire.publish_response  # its signature differs between the two sides
    try:
        for rep in range(args.reps):
            records = [rng.randbytes(args.size) for _ in range(args.records)]
            t0 = time.perf_counter()
            data = _sdk_build(records, (f"sdk-bench-{os.getpid()}", 1 + rep * args.records))
            t1 = time.perf_counter()
            request = broker_pb2.PublishRequest.FromString(data)
            batch = server_wire.publish_batch(request)
            if lean is not None:
                placed = lean(batch, "")
                t2 = submitter.submitted_at
                t3 = time.perf_counter()
                out = respond(placed, request).SerializeToString()
            else:
                placements = log.publish(batch, "")
                t2 = submitter.submitted_at
                t3 = time.perf_counter()
                out = respond(placements).SerializeToString()
            t4 = time.perf_counter()
            _sdk_parse(out, args.records)
            t5 = time.perf_counter()
            per = 1e6 / args.records
            for name, took in (("sdk_build", t1 - t0), ("server_in", t2 - t1), ("server_out", t4 - t3),
                               ("sdk_parse", t5 - t4)):
                phases[name].append(took * per)
    finally:
        replicator.close()
    print(f"records={args.records} size={args.size} reps={args.reps} load={os.getloadavg()[0]:.2f}")
    total = 0.0
    for name, values in phases.items():
        median = statistics.median(values)
        total += median
        print(f"{name:11s} {median:7.3f} us/record (min {min(values):.3f})")
    print(f"{'total':11s} {total:7.3f} us/record")


if __name__ == "__main__":
    main()
